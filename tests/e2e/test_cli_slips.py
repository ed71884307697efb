"""The first hour's slips that need a socket, through `python -m localserve` processes: a port
in use said before the model loads, `chat` given the address `serve` prints or host:port, with
its lines from a file or /dev/null, without the token a server needs or with it from a file or
$LOCALSERVE_TOKEN, a --resume that cannot be, left with Ctrl-C at the prompt; (real model) a
chat template llama.cpp cannot use, refused when `serve` starts; and every other slip of the
command line (a port out of range or not a number, a bad host, URL, count or list, a users file
missing or malformed, a state directory that cannot be made, a sweep's unknown policy) in one
line, before any model loads. The slips that need no socket are in unit/cli/test_cli.py."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from localserve.bench.fake_server import FakeServer
from localserve.ops.auth import Access, AuthThrottle
from tests.support.cli import localserve, slip_line
from tests.support.paths import ROOT


@contextlib.contextmanager
def users(fake, **tokens):
    """The fake server with these users (and a fresh throttle) for a while."""
    admission = fake.server.admission
    old = admission.access, admission.authentication.throttle
    admission.access = Access(tokens)
    admission.authentication.throttle = AuthThrottle(fake.config.max_auth_failures_per_minute)
    try:
        yield
    finally:
        admission.access, admission.authentication.throttle = old


def test_a_port_in_use_is_said_before_the_model_loads(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ran = localserve("serve", "--port", str(port), "--state-dir", str(tmp_path), cwd=tmp_path)
    line = slip_line(ran, f"port {port}", "already in use", "--port")
    assert line == (
        f"localserve: port {port} on 127.0.0.1 is already in use (another server?): "
        "stop it, or pick another with --port"
    )
    assert "gemma" not in ran.stdout  # what runs where is printed once the model has loaded


SLIPS = [  # argv, the words of its one line
    (["serve", "--port", "99999"], ["argument --port", "'99999' is not a port (0-65535)"]),
    (["serve", "--port", "-1"], ["argument --port", "'-1' is not a port"]),
    (["serve", "--port", "http"], ["argument --port", "'http' is not a port"]),
    (["serve", "--open", "--host", "999.1.1.1"], ["cannot listen on 999.1.1.1:", "(--host)"]),
    (
        ["serve", "--open", "--host", "no such host.invalid"],
        ["cannot listen on no such host", "(--host)"],
    ),
    (["serve", "--users", "missing.toml"], ["missing.toml: no such users file"]),
    (["serve", "--users", "{bad}"], ["not valid TOML"]),
    (["serve", "--state-dir", "{file}/state"], ["cannot create the state directory"]),
    (["chat", "ws://127.0.0.1:abc"], ["the port is not a number from 0 to 65535"]),
    (["chat", "http://127.0.0.1:99999"], ["the port is not a number from 0 to 65535"]),
    (["chat", "foo bar"], ["no host in it"]),
    (["chat", "ftp://example.org"], ["not a server address"]),
    (["chat", "--max-tokens", "0"], ["argument --max-tokens", "'0': must be at least 1"]),
    (["chat", "--temperature", "-1"], ["argument --temperature", "at least 0"]),
    (["monitor", "--url", "ws://127.0.0.1:0"], ["argument --url", "port 0 is not a server's"]),
    (["bench", "--num-requests", "0"], ["argument --num-requests", "must be at least 1"]),
    (["bench", "--request-rate", "-2"], ["argument --request-rate", "must be above 0"]),
    (["bench", "--concurrency", "four"], ["argument --concurrency", "'four' is not a whole"]),
    (["bench", "--url", "localhost:port"], ["argument --url", "the port is not a number"]),
    (["bench", "--peer", "ws://127.0.0.1:8080"], ["argument --peer", "expected http://"]),
    (["bench-engine", "--concurrency", "1,x"], ["argument --concurrency", "e.g. 1,4,8"]),
    (["bench-engine", "--tokens", "0"], ["argument --tokens", "must be at least 1"]),
    (["sweep", "--concurrency", "0"], ["argument --concurrency", "comma-separated"]),
    (["sweep", "--policies", "fifo"], ["--policies: fifo: not one of continuous, static"]),
    (["sweep", "--workloads", "chat,huge"], ["--workloads: huge: not one of short"]),
    (["generate", "hi", "--max-tokens", "-5"], ["argument --max-tokens", "at least 1"]),
    (["generate", "hi", "--temperature", "nan"], ["argument --temperature", "not a number"]),
    (["generate", "hi", "--rpc", "10.0.0.2"], ["argument --rpc", "expected HOST:PORT"]),
    (["demo", "--pace", "-1"], ["argument --pace", "at least 0"]),
    (["worker", "--port", "70000"], ["argument --port", "not a port"]),
    (["worker", "--port", "0"], ["--port 0: a worker needs a port of its own"]),
    (["worker", "--threads", "0"], ["argument --threads", "must be at least 1"]),
]


@pytest.mark.parametrize(("argv", "words"), SLIPS, ids=[" ".join(a) for a, _ in SLIPS])
def test_every_slip_is_one_line_before_anything_loads(tmp_path, argv, words):
    (tmp_path / "models.toml").write_text('default = "gemma-3-270m"\n')
    (tmp_path / "bad.toml").write_text("[users\n")
    (tmp_path / "file").write_text("")
    argv = [a.format(bad=tmp_path / "bad.toml", file=tmp_path / "file") for a in argv]
    ran = localserve(*argv, cwd=tmp_path, env={"LOCALSERVE_STATE_DIR": str(tmp_path)})
    line = slip_line(ran, *words)
    assert line.startswith(f"localserve{' ' + argv[0] if 'argument' in line else ''}: "), line
    assert ran.stdout == ""  # nothing loaded: what runs where is printed once a model has


def test_chat_reads_lines_from_a_file_as_messages(fake, tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("Hello there\n/help\n/nope\nSecond question\n")
    port = fake.url.rsplit(":", 1)[1]
    with open(lines) as stdin:
        ran = localserve("chat", f"http://127.0.0.1:{port}", "--max-tokens", "4", stdin=stdin)
    assert ran.returncode == 0 and ran.stderr == "", ran.stderr
    out = ran.stdout
    assert f"Connected to fake at ws://127.0.0.1:{port}" in out
    assert "you> Hello there\nmodel> " in out and "you> Second question\nmodel> " in out
    assert out.count("4 tokens · length]") == 2  # each line one message, each reply printed
    assert "unknown command /nope; /help lists them" in out
    assert out.endswith("you> \n")  # and at the end of the file it leaves


def test_chat_with_dev_null_or_host_port_connects_and_leaves(fake):
    host_port = fake.url.removeprefix("ws://")
    with open("/dev/null") as null:
        runs = [localserve("chat", host_port, stdin=stdin) for stdin in (subprocess.DEVNULL, null)]
    for ran in runs:
        assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
        assert ran.stdout.startswith(f"Connected to fake at {fake.url}")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_chat_with_no_server_says_nothing_listens_and_how_to_start_one(host):
    with socket.socket() as free:  # a port nothing listens on: bound, never listening
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
        ran = localserve("chat", f"{host}:{port}", stdin=subprocess.DEVNULL)
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr
    assert ran.stderr.strip() == (
        f"localserve chat: nothing listens at ws://{host}:{port}: start a server with "
        "`localserve serve` (or `make run`), or give the address it printed"
    )


def test_chat_without_the_token_a_server_needs_says_so(fake, tmp_path):
    with users(fake, ann="s3cret"):
        line = slip_line(localserve("chat", fake.url, "--name", "ann"), "needs a token")
        assert line == (
            f"localserve chat: {fake.url}: this server needs a token: pass --token, "
            "--token-file FILE or set $LOCALSERVE_TOKEN (ask whoever runs it for yours)"
        )
        wrong = slip_line(localserve("chat", fake.url, "--name", "ann", "--token", "x"))
        assert wrong.endswith("unauthorized: unknown user or wrong token")
        (tmp_path / "token").write_text("s3cret\n")
        for argv, env in [
            (["--token-file", str(tmp_path / "token")], {}),
            ([], {"LOCALSERVE_TOKEN": "s3cret"}),
        ]:
            ran = localserve("chat", fake.url, "--name", "ann", *argv, env=env)
            assert ran.returncode == 0, ran.stderr
            assert "as ann." in ran.stdout


def test_chat_resume_that_cannot_be_is_one_line(fake, tmp_path):
    """--resume given an address (the id is optional: it takes the next word), or on a server
    that keeps no conversations, or of an id it does not have (tui/server_chats.py)."""
    slip_line(localserve("chat", "--resume", fake.url), "--resume:", "an address goes before")
    line = slip_line(localserve("chat", fake.url, "--resume"), "keeps no conversations")
    assert line.startswith("localserve chat: --resume: this server keeps no conversations")
    store = FakeServer(access=Access({"ann": "s3cret"}), state_dir=str(tmp_path))
    try:
        ann = ["--name", "ann", "--token", "s3cret"]
        line = slip_line(localserve("chat", store.url, *ann, "--resume"), "no conversations")
        assert line == "localserve chat: --resume: you have no conversations on the server yet"
        line = slip_line(localserve("chat", store.url, *ann, "--resume", "c1"), "'c1'")
        assert line == "localserve chat: --resume: you have no conversation 'c1' on this server"
    finally:
        store.close()


def test_ctrl_c_at_the_prompt_leaves_cleanly(fake):
    command = [sys.executable, "-m", "localserve", "chat", fake.url]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    ) as chat:
        seen = b""
        deadline = time.monotonic() + 30
        while b"you> " not in seen and time.monotonic() < deadline:
            seen += chat.stdout.read1(1024)
        assert b"you> " in seen
        chat.send_signal(signal.SIGINT)
        out, err = chat.communicate(timeout=30)
    assert chat.returncode == 0, err
    assert b"Traceback" not in err and err == b""


@pytest.mark.model
@pytest.mark.parametrize(
    ("template", "why"),
    [('chat_template = "gemmma"', "llama.cpp does not know 'gemmma'"), ("", "the model has none")],
)
def test_a_chat_template_llama_cpp_cannot_use_is_refused_when_serve_starts(tmp_path, template, why):
    """The embedded Gemma's GGUF has no template of its own (it is served as a transcript)."""
    (tmp_path / "models.toml").write_text(
        f'default = "base"\n[models.base]\nembedded = true\n{template}\n'
    )
    ran = localserve(
        "serve", "--port", "0", "--state-dir", str(tmp_path), cwd=tmp_path, timeout=300
    )
    line = slip_line(ran, "[models.base] chat_template", why, 'chat_format = "transcript"')
    assert line.startswith(f"localserve: [models.base] chat_template: {why}; set chat_template")
