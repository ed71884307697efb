"""The import contracts (pyproject.toml, `lint-imports`) catch what they are for: each forbidden
import below, added to a scratch copy of the source tree, breaks the contract named beside it,
and the unmodified copy keeps them all. docs/architecture.md ("The layers") lists the contracts.
"""

from __future__ import annotations

import shutil

import pytest

from tests.support.import_contracts import lint_with_each
from tests.support.paths import ROOT

LAYERS = "localserve's layers"
SEAM = "the front-ends reach the server only through the seam (admission's Frontdoor)"
NO_IO = "the engine core does no I/O of its own"

# (the module that gains the import, the import, the contract it breaks)
FORBIDDEN = [
    ("serve/page.py", "from localserve.serve.pool import ModelPool", SEAM),
    ("serve/openai/reply.py", "from localserve.serve.routing import SinkRouter", SEAM),
    (
        "serve/websocket/connection.py",
        "from localserve.engine_process.parent import EngineProcess",
        SEAM,
    ),
    ("serve/anthropic/messages.py", "from localserve.runners.llama import LlamaRunner", SEAM),
    ("serve/tool_use.py", "from localserve.serve.server import Server", SEAM),
    ("ops/usage.py", "from localserve.runners.models import resolve_model", LAYERS),
    ("engine/scheduler.py", "import sqlite3", NO_IO),
    ("engine/kv.py", "from pathlib import Path", NO_IO),
    ("protocol/frames.py", "import shutil", NO_IO),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[tuple[int, dict[str, str]]]:
    """lint-imports on a copy of the packages and pyproject.toml: as they are, then per import."""
    tree = tmp_path_factory.mktemp("tree")
    for package in ("localserve", "tui"):
        shutil.copytree(
            ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tree)
    edits = [None] + [(f"localserve/{module}", line) for module, line, _ in FORBIDDEN]
    return lint_with_each(tree, edits)


def test_the_unmodified_tree_keeps_every_contract(runs):
    status, verdicts = runs[0]
    assert status == 0, verdicts
    assert set(verdicts.values()) == {"KEPT"}
    for contract in (LAYERS, SEAM, NO_IO):
        assert any(name.startswith(contract) for name in verdicts), list(verdicts)


@pytest.mark.parametrize(("case", "contract"), [(i + 1, c) for i, (*_, c) in enumerate(FORBIDDEN)])
def test_a_forbidden_import_breaks_its_contract(runs, case, contract):
    status, verdicts = runs[case]
    broken = [name for name, verdict in verdicts.items() if verdict == "BROKEN"]
    assert status == 1
    assert [name for name in broken if name.startswith(contract)], (FORBIDDEN[case - 1], broken)
