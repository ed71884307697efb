"""The import contracts (pyproject.toml, `lint-imports`) catch what they are for: each forbidden
import below, added to a scratch copy of the source tree, breaks the contract named beside it,
and the unmodified copy keeps them all. docs/architecture.md ("The layers") lists the contracts.
"""

from __future__ import annotations

import shutil

import pytest

from tests.support.import_contracts import Lint, lint_with_each
from tests.support.paths import ROOT

LAYERS = "localserve's layers"
SEAM = "the front-ends reach the server only through the seam (admission's Frontdoor)"
NO_IO = "the engine core does no I/O of its own"
NO_TESTS = "localserve and tui import no test code"

# (the module that gains the import, the import, the contract it breaks, what lint-imports says)
FORBIDDEN = [
    (
        "serve/page.py",
        "from localserve.serve.pool import ModelPool",
        SEAM,
        "localserve.serve.page is not allowed to import localserve.serve.pool",
    ),
    (
        "serve/openai/reply.py",
        "from localserve.serve.routing import SinkRouter",
        SEAM,
        "localserve.serve.openai is not allowed to import localserve.serve.routing",
    ),
    (
        "serve/websocket/connection.py",
        "from localserve.engine_process.parent import EngineProcess",
        SEAM,
        "localserve.serve.websocket is not allowed to import localserve.engine_process",
    ),
    (
        "serve/anthropic/messages.py",
        "from localserve.runners.llama import LlamaRunner",
        SEAM,
        "localserve.serve.anthropic is not allowed to import localserve.runners",
    ),
    (
        "serve/tool_use.py",
        "from localserve.serve.server import Server",
        SEAM,
        "localserve.serve.tool_use is not allowed to import localserve.serve.server",
    ),
    (
        "ops/usage.py",
        "from localserve.runners.models import resolve_model",
        LAYERS,
        "localserve.ops is not allowed to import localserve.runners",
    ),
    (
        "engine/scheduler.py",
        "import sqlite3",
        NO_IO,
        "localserve.engine is not allowed to import sqlite3",
    ),
    (
        "engine/kv.py",
        "from pathlib import Path",
        NO_IO,
        "localserve.engine is not allowed to import pathlib",
    ),
    (
        "protocol/frames.py",
        "import shutil",
        NO_IO,
        "localserve.protocol is not allowed to import shutil",
    ),
    (
        "bench/hostile.py",
        "from tests.support.clients import Streamer",
        NO_TESTS,
        "localserve is not allowed to import tests",
    ),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Lint]:
    """lint-imports on a copy of the packages and pyproject.toml: as they are, then per import."""
    tree = tmp_path_factory.mktemp("tree")
    for package in ("localserve", "tui"):
        shutil.copytree(
            ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tree)
    edits = [None] + [(f"localserve/{module}", line) for module, line, *_ in FORBIDDEN]
    return lint_with_each(tree, edits)


def test_the_unmodified_tree_keeps_every_contract(runs):
    lint = runs[0]
    assert lint.status == 0, lint.output
    assert set(lint.verdicts.values()) == {"KEPT"}
    for contract in (LAYERS, SEAM, NO_IO, NO_TESTS):
        assert any(name.startswith(contract) for name in lint.verdicts), list(lint.verdicts)


@pytest.mark.parametrize(
    "case", range(1, len(FORBIDDEN) + 1), ids=[line for _, line, *_ in FORBIDDEN]
)
def test_a_forbidden_import_breaks_its_contract(runs, case):
    _, _, contract, says = FORBIDDEN[case - 1]
    lint = runs[case]
    broken = [name for name, verdict in lint.verdicts.items() if verdict == "BROKEN"]
    assert lint.status == 1
    assert [name for name in broken if name.startswith(contract)], broken
    assert f"{says}:" in lint.output, lint.output
