"""`python -m localserve ...` run as a user would, and the check that a slip was answered as
issue 27 asks: exit status 2, one line on stderr that names what to do, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.paths import ROOT


def localserve(*argv: str, timeout: float = 60, env: dict | None = None, **kw):
    """This checkout's command line in a process of its own; its CompletedProcess (text)."""
    base = {
        k: v for k, v in os.environ.items() if k not in ("LOCALSERVE_MODELS", "LOCALSERVE_TOKEN")
    }
    command = [sys.executable, "-m", "localserve", *argv]
    kw.setdefault("stdin", subprocess.DEVNULL)
    kw.setdefault("stdout", subprocess.PIPE)
    environment = base | {"PYTHONPATH": str(ROOT)} | (env or {})
    return subprocess.run(
        command, env=environment, stderr=subprocess.PIPE, text=True, timeout=timeout, **kw
    )


def slip_line(ran: subprocess.CompletedProcess, *words: str) -> str:
    """The one line a slip gets, checked: status 2, no traceback, each of `words` in it."""
    assert "Traceback" not in ran.stderr + ran.stdout, ran.stderr
    assert ran.returncode == 2, (ran.returncode, ran.stderr)
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1, ran.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]
