"""`python -m localserve ...` run as a user would, and the check that a slip was answered as
issue 27 asks: exit status 2, one line on stderr that names what to do, no traceback; and
`localserve serve` as a process of its own, to kill."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

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


def start_serve(
    state: Path, env: dict | None = None, args: tuple[str, ...] = ()
) -> tuple[subprocess.Popen, str]:
    """`localserve serve` (the embedded model, with `args`) on any free port with this state
    directory, in a session of its own (kill_serve ends it and its engine process): the
    process (what it printed up to its URL in `startup_lines`), its URL."""
    env = os.environ | {"LOCALSERVE_STATE_DIR": str(state)} | (env or {})
    command = [sys.executable, "-m", "localserve", "serve", "--port", "0", *args]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    proc.startup_lines = []
    for line in proc.stdout:
        proc.startup_lines.append(line)
        if found := re.search(r"on (ws://127\.0\.0\.1:\d+)", line):
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep it drained
            return proc, found[1]
        assert time.monotonic() < deadline, "the server did not start"
    raise AssertionError(f"the server exited: {proc.wait()}")


def kill_serve(proc: subprocess.Popen) -> None:
    """SIGKILL the server and its engine process: no clean shutdown of anything."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
