"""The front doors' unit tests (tests/unit/serve/openai, ollama, anthropic, websocket) need no
llama.cpp: they run on the fake Frontdoor (tests/support/fake_frontdoor.py), so they import and
pass in a Python where `llama_cpp` cannot be imported at all. Run in a subprocess, since this
one has loaded it (or may, through other tests)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support.paths import ROOT

DOORS = ["openai", "ollama", "anthropic", "websocket"]

# llama_cpp made unimportable before anything else: `import llama_cpp` raises ImportError
WITHOUT_LLAMA_CPP = (
    "import sys; sys.modules['llama_cpp'] = None; import pytest; "
    "sys.exit(pytest.main(sys.argv[1:]))"
)


def test_the_front_doors_tests_import_and_pass_where_llama_cpp_cannot_be_imported():
    paths = [f"tests/unit/serve/{door}" for door in DOORS]
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_LLAMA_CPP, *paths, "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed.group(1)) >= 100, tail
    assert not re.search(r"\d+ (failed|error|skipped)", done.stdout), tail
