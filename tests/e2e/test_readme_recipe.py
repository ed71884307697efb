"""The README's household recipe, run as written on this checkout (issue 38).

The commands of its first shell block run in one bash, in a folder of their own (`.venv` there
is this checkout's), as a person pastes them, except:

- `make run`: the set-up is `make test`'s own (done before this runs), and the demo is a
  full-screen program with tests of its own (tests/e2e/test_serving.py);
- the commands marked "(network)" (`localserve pull`, docker): the pulled entry is written as
  `pull` writes it (cli/pull.py's entry_text) for a GGUF that is here, the embedded one;
- `serve` is given `--port 0`, so that no fixed port is needed, and the monitor the server's
  URL for the same reason.

Then what the recipe promises is checked against the server it started: the page for a phone,
a person's token from `users add`, Open WebUI's forwarded people and the monitor on the same
machine with no token typed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from localserve.bench.blocking_ws import WS
from localserve.cli.pull import entry_name, entry_text
from localserve.ops.usage import DATABASE as USAGE_DATABASE
from localserve.runners.models import ensure_embedded
from tests.support.monitor import monitor_header
from tests.support.paths import ROOT

RECIPE = re.compile(r"<!-- recipe\b.*?-->\n```sh\n(.*?)```", re.S)


def recipe() -> list[tuple[str, str]]:
    """The recipe's commands with their comments, continuation lines joined."""
    block = RECIPE.search((ROOT / "README.md").read_text(encoding="utf-8"))
    assert block, "README.md has no recipe block"
    commands, pending = [], ""
    for line in block[1].splitlines():
        code, _, comment = line.partition("  #")
        code = pending + code.strip()
        if code.endswith("\\"):
            pending = code[:-1] + " "
            continue
        pending = ""
        if code:
            commands.append((code, comment))
        elif commands:  # a comment that goes on from the command above
            commands[-1] = (commands[-1][0], commands[-1][1] + comment)
    return commands


def test_the_recipe_is_short_and_first():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("## A household server")
    end = text.index("\n## ", start + 1)
    assert text.index("\n## ") == start - 1  # the first section
    assert len(text[start:end].splitlines()) <= 40
    words = [code.split()[:3] for code, _ in recipe()]
    assert ["make", "run"] in words
    assert [".venv/bin/localserve", "pull"] in [w[:2] for w in words]
    assert [".venv/bin/localserve", "serve"] in [w[:2] for w in words]


def script(commands: list[tuple[str, str]], pulled: str) -> str:
    lines = ["set -euo pipefail"]
    for code, comment in commands:
        if code == "make run":
            continue
        if "(network)" in comment:
            assert " pull " in f" {code} ", code  # the only network step of this block
            lines.append(f"cat >> home.toml <<'EOF'\n{pulled}EOF")
            continue
        if " serve " in f" {code} ":
            code = f"exec {code} --port 0"
        lines.append(code)
    return "\n".join(lines) + "\n"


@pytest.mark.model
def test_the_recipe_runs_as_written_and_serves_the_household(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".venv").symlink_to(Path(sys.executable).parent.parent)
    repo = next(code for code, _ in recipe() if " pull " in f" {code} ").split()[2]
    name = entry_name(repo.split(":")[0], "Q4_K_M")
    pulled = entry_text(name, ensure_embedded(), 2048).lstrip("\n")
    pulled += 'chat_template = "gemma"  # the embedded GGUF carries none\nn_threads = 2\n'
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALSERVE_")}
    env |= {"LOCALSERVE_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        ["bash", "-c", script(recipe(), pulled)],
        cwd=home,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        tokens, port = {}, None
        for line in proc.stdout:
            if found := re.fullmatch(r"  (\S+)\s+(\S{32,})\n", line):
                tokens[found[1]] = found[2]
            if found := re.search(r"serving (\S+) on ws://0\.0\.0\.0:(\d+)", line):
                assert found[1] == name  # the pulled model is the household's default
                port = int(found[2])
                break
        assert port, f"the server did not start: {proc.wait()}"
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        assert sorted(tokens) == ["alice", "bob", "openwebui"]
        assert oct((home / "users.toml").stat().st_mode & 0o777) == "0o600"
        check_the_household(port, tokens, name)
        # 8. the monitor on the same machine, as the recipe's shell has it: no token typed
        monkeypatch.setenv("LOCALSERVE_STATE_DIR", env["LOCALSERVE_STATE_DIR"])
        monkeypatch.setenv("LOCALSERVE_MODELS", str(home / "home.toml"))
        header, _ = monitor_header(f"ws://127.0.0.1:{port}", model=name)
        assert header.startswith("● live") and name in header
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    db = sqlite3.connect(tmp_path / "state" / USAGE_DATABASE)
    try:
        users = [user for (user,) in db.execute("SELECT user FROM requests ORDER BY id")]
    finally:
        db.close()
    assert users == ["alice", "openwebui/carol"]  # each person a user of their own


def check_the_household(port: int, tokens: dict[str, str], model: str) -> None:
    http = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(f"{http}/") as page:  # 6. the phone's page
        assert page.status == 200 and b"<html" in page.read()
    ws = WS(f"ws://127.0.0.1:{port}")  # a person with the token `users add` printed
    try:
        welcome = ws.hello("alice", tokens["alice"])
        assert welcome["models"] == [model]  # only the household's model: no toy one
        ws.chat("r1", "Hello!", max_tokens=4)
        assert ws.until_done("r1", timeout=120)[-1]["finish_reason"] in ("stop", "length")
    finally:
        ws.close()
    body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    request = urllib.request.Request(  # 7. Open WebUI, saying who asks
        f"{http}/v1/chat/completions",
        json.dumps(body).encode(),
        {
            "Authorization": f"Bearer {tokens['openwebui']}",
            "Content-Type": "application/json",
            "X-OpenWebUI-User-Name": "Carol",
            "X-OpenWebUI-User-Id": "id-carol",
        },
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        assert reply.status == 200 and json.load(reply)["choices"]
