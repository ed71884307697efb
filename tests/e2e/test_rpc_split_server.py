"""The server with its model split across two `localserve worker` processes on loopback: two
users stream, a worker that dies or stops fails the replies in flight cleanly (the server stays
up, says which worker is gone, refuses new chats) and the server serves again once it is back."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
import urllib.error
import urllib.request

import msgspec
import pytest

from localserve.bench.blocking_ws import WS
from tests.support.clients import ends_with_an_error
from tests.support.live import live_config
from tests.support.waiting import wait_until
from tests.support.workers import Worker

pytestmark = pytest.mark.model

STEP_TIMEOUT_S = 3.0
PROMPTS = ["The capital of France is", "Write a haiku about rain.", "List three colours."]


def healthz(served) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(served.thread.http + "/healthz", timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


class Split:
    """Two workers and a server whose model has 12 of its 18 layers on them."""

    def __init__(self, max_num_batched_tokens: int = 256) -> None:
        from localserve.serve.serving import serving

        self.workers = [Worker(), Worker()]
        config = live_config()
        model = msgspec.structs.replace(
            config.models[config.default],
            max_num_batched_tokens=max_num_batched_tokens,
            n_gpu_layers=12,
            split_mode="layer",
            tensor_split=[1, 1],
            rpc_workers=[w.endpoint for w in self.workers],
        )
        config.models[config.default] = model
        config.server = msgspec.structs.replace(
            config.server, step_timeout_s=STEP_TIMEOUT_S, load_timeout_s=60, usage=False
        )
        self._serving = serving(config, thread=True)
        self.served = self._serving.__enter__()
        self.url = self.served.thread.url

    def serves(self) -> bool:
        status, body = healthz(self.served)
        return status == 200 and body["ok"]

    def close(self) -> None:
        self._serving.__exit__(None, None, None)
        for w in self.workers:
            if w.proc.poll() is None:
                os.kill(w.proc.pid, signal.SIGCONT)
            w.close()


@pytest.fixture(scope="module")
def split():
    s = Split()
    yield s
    s.close()


def reply(url: str, text: str, max_tokens: int = 24) -> str:
    ws = WS(url)
    try:
        ws.hello("greedy")
        ws.chat("r", text, max_tokens=max_tokens)
        frames = ws.until_done("r", timeout=120)
    finally:
        ws.close()
    assert frames[-1]["finish_reason"] in ("stop", "length"), frames[-3:]
    return "".join(f["text"] for f in frames if f["type"] == "token")


@pytest.fixture
def whole():
    """The model unsplit, started afresh: its cache then holds what the split one's does. (The
    session's live server holds what earlier tests left, and cells computed in other batches
    can differ in the last bits: enough to flip a near tie in a greedy reply.)"""
    from localserve.serve.serving import serving

    config = live_config()
    config.server = msgspec.structs.replace(config.server, usage=False)
    with serving(config, thread=True) as served:
        yield served.thread.url


def test_the_split_model_says_what_the_whole_one_does(split, whole):
    for prompt in PROMPTS:  # greedy, one at a time: token for token the same
        assert reply(split.url, prompt) == reply(whole, prompt), prompt
    info = split.served.server.runner.info
    assert [d.layers for d in info.devices] == [7, 6, 5]
    assert [d.endpoint for d in info.devices[1:]] == [w.endpoint for w in split.workers]


def streaming(split, users=("alice", "bob")) -> list[WS]:
    """Each user starts a long reply; returns once both have streamed a few tokens and a decode
    step of a kind measured runs (a worker stopped in a cold one waits 3 × step_timeout_s)."""
    clients = []
    for user in users:
        ws = WS(split.url)
        ws.hello(user)
        ws.chat("long", "Tell me a very long story about a dragon.", max_tokens=2000)
        clients.append(ws)
    for ws in clients:
        ws.until(lambda f: f["type"] == "token" and len(f["text"]) > 0)
        ws.until(lambda f: f["type"] == "token")
    measured_decode(split.served.engine._step_clock)
    return clients


def measured_decode(clock) -> None:
    """Wait for a decode step of a kind already measured (the first is given 3 × step_timeout_s)."""
    wait_until(
        lambda: (r := clock.read()).expected_s and not r.prefill_tokens and r.is_measured,
        30,
        "a measured kind of decode step runs",
        interval=0.001,
    )


def refused_while_down(split) -> dict:
    ws = WS(split.url)
    try:
        ws.hello("late")
        ws.chat("new", "hello")
        return ws.recv()
    finally:
        ws.close()


def test_two_users_stream_and_a_dead_worker_fails_their_replies_cleanly(split):
    clients = streaming(split)
    dead = split.workers[1]
    dead.proc.kill()  # mid-reply: llama.cpp aborts the engine process
    dead.proc.wait(10)
    for ws in clients:
        error = ends_with_an_error(ws, within=30)
        assert "SIGABRT" in error["message"] and dead.endpoint in error["message"]
        ws.close()
    status, body = healthz(split.served)  # the server is up and says which worker is gone
    assert status == 503 and not body["ok"]
    assert dead.endpoint in body["problem"] and "connection refused" in body["problem"]
    gone = [w for w in body["workers"] if not w["up"]]
    assert [w["endpoint"] for w in gone] == [dead.endpoint]
    refusal = refused_while_down(split)
    assert refusal["type"] == "error" and refusal["code"] == "unavailable"
    assert dead.endpoint in refusal["message"]

    split.workers[1] = Worker(dead.port)  # back on the same port: the server serves again
    wait_until(split.serves, 60, "the server serves again")
    assert reply(split.url, PROMPTS[0]).strip()


def test_a_stopped_worker_is_caught_by_the_watchdog(split):
    clients = streaming(split)
    frozen = split.workers[0]
    os.kill(frozen.proc.pid, signal.SIGSTOP)  # llama_decode waits forever for its answer
    try:
        for ws in clients:
            error = ends_with_an_error(ws, within=STEP_TIMEOUT_S + 30)
            assert "step_timeout_s" in error["message"] and frozen.endpoint in error["message"]
            ws.close()
        status, body = healthz(split.served)
        assert status == 503 and "not answering" in body["problem"], body
        assert frozen.endpoint in body["problem"]
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
    wait_until(split.serves, 60, "the server serves again")
    assert reply(split.url, PROMPTS[0]).strip()
    assert split.served.engine.restarts == 2


def test_a_worker_that_dies_while_idle_is_noticed_before_the_next_chat(split):
    """Nothing runs, so llama.cpp cannot notice: the watchdog's look at the workers' ports
    does, /healthz says so within its bound, and the next chat is refused (not failed midway)
    until the worker is back."""
    wait_until(split.serves, 60, "the server serves")
    restarts = split.served.engine.restarts
    dead = split.workers[0]
    dead.proc.kill()
    dead.proc.wait(10)
    started = time.monotonic()

    def says_gone() -> bool:
        status, body = healthz(split.served)
        return status == 503 and dead.endpoint in body.get("problem", "")

    wait_until(says_gone, 30, "/healthz names the dead worker")  # before any chat
    assert time.monotonic() - started < 30
    refusal = refused_while_down(split)
    assert refusal["code"] == "unavailable" and dead.endpoint in refusal["message"]
    split.workers[0] = Worker(dead.port)
    wait_until(split.serves, 60, "the server serves again")
    assert reply(split.url, PROMPTS[0]).strip()
    assert split.served.engine.restarts == restarts + 1


def test_an_unreachable_worker_at_start_up_is_an_error_naming_it(tmp_path):
    import subprocess
    import sys

    from tests.support.workers import free_port

    endpoint = f"127.0.0.1:{free_port()}"  # nobody listens there
    config = tmp_path / "models.toml"
    config.write_text(
        "[models.gemma-3-270m]\nembedded = true\nn_gpu_layers = 4\n"
        f'rpc_workers = ["{endpoint}"]\n[server]\nusage = false\n'
    )
    for command in (["serve", "--port", "0"], ["generate", "hi"]):
        done = subprocess.run(
            [sys.executable, "-m", "localserve", "--config", str(config), *command],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, (command, done.stderr[-1500:])
        assert f"RPC worker {endpoint}: connection refused" in done.stderr, done.stderr[-1500:]


def test_any_llama_cpp_abort_fails_only_the_replies_in_flight(tmp_path):
    """No workers: the engine process itself aborts mid-reply (as llama.cpp does on a failed
    assertion). Websocket and HTTP streams end with `unavailable`, the usage record keeps what
    they had, and the server serves again."""
    from localserve.serve.serving import serving

    config = live_config()
    config.server = msgspec.structs.replace(config.server, state_dir=str(tmp_path))
    with serving(config, thread=True) as served:
        ws = WS(served.thread.url)
        ws.hello("alice")
        ws.chat("long", "Tell me a very long story about a dragon.", max_tokens=2000)
        ws.until(lambda f: f["type"] == "token")
        body = json.dumps(
            {
                "model": "gemma-3-270m",
                "prompt": "Once upon a time",
                "max_tokens": 2000,
                "stream": True,
            }
        ).encode()
        http = urllib.request.urlopen(
            urllib.request.Request(served.thread.http + "/v1/completions", body), timeout=60
        )
        assert http.readline().startswith(b"data: ")
        os.kill(served.engine._process.pid, signal.SIGABRT)
        error = ends_with_an_error(ws, within=30)
        assert "SIGABRT" in error["message"]
        rest = http.read().decode()
        assert '"engine_unavailable"' in rest and rest.rstrip().endswith("data: [DONE]")
        http.close()
        wait_until(lambda: healthz(served)[0] == 200, 60, "the server serves again")
        ws.chat("again", "Hello", max_tokens=8)
        assert ws.until_done("again")[-1]["finish_reason"] in ("stop", "length")
        ws.close()
        assert served.engine.restarts == 1
    rows = sqlite3.connect(tmp_path / "usage.sqlite3").execute(
        "SELECT client_id, finish_reason, completion_tokens, ttft_ms, e2e_ms FROM requests"
    )
    rows = {client_id: rest for client_id, *rest in rows}
    reason, tokens, ttft_ms, e2e_ms = rows["long"]  # its timings as the server saw them
    assert reason == "error" and tokens >= 1 and 0 < ttft_ms < e2e_ms
    assert rows["again"][0] in ("stop", "length")


def test_a_worker_frozen_after_a_long_prefill_ends_every_stream_soon_after_its_step_was_due():
    """A long prompt in one step of 1024 tokens, then both replies decode and a worker freezes:
    the hung decode step is judged by its own tokens, not by the long chunk (the old rule,
    step_timeout_s + 4 × the longest step, let it hang for 3 + 4 × that chunk's seconds)."""
    split = Split(max_num_batched_tokens=1024)
    try:
        clock = split.served.engine._step_clock
        clients = []
        for user, prompt in (
            ("alice", "The history of Paris, in full detail. " * 100),
            ("bob", PROMPTS[1]),
        ):
            ws = WS(split.url)
            ws.hello(user)
            ws.chat("long", prompt, max_tokens=400, ignore_eos=True)
            clients.append(ws)
        for ws in clients:
            ws.until(lambda f: f["type"] == "token", timeout=120)
        measured_decode(clock)
        frozen = split.workers[0]
        os.kill(frozen.proc.pid, signal.SIGSTOP)

        def hangs():  # the step that needs the worker: half a second past when it was due
            r = clock.read()
            return r if r.started and time.monotonic() > r.started + r.expected_s + 0.5 else None

        hung = wait_until(hangs, 30, "a step hangs on the frozen worker", interval=0.001)
        due = hung.started + hung.expected_s  # when it should have ended
        assert hung.started and hung.prefill_tokens == 0, hung
        for ws in clients:
            error = ends_with_an_error(ws, within=60)
            # ended by the limit of that decode step, judged by its own tokens (not the chunk's)
            assert hung.describe_limit(STEP_TIMEOUT_S) in error["message"], (hung, error)
            assert time.monotonic() - due < 60, time.monotonic() - due
            ws.close()
    finally:
        for w in split.workers:
            if w.proc.poll() is None:
                os.kill(w.proc.pid, signal.SIGCONT)
        split.close()
