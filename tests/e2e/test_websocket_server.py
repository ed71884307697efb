"""The websocket server against the real model: streaming, cancelling, KV cells, the command,
prefix caching. The protocol's logic that needs no model (bad frames, limits, access, HTTP,
a soak of many clients) runs on the FakeRunner in test_websocket_connection.py."""

from __future__ import annotations

import threading
import time

import pytest
from websockets.exceptions import ConnectionClosed

from localserve.serve.prompt import PREAMBLE
from tests.support.fakes import prefilling
from tests.support.waiting import wait_until

pytestmark = pytest.mark.model

QUESTION = "What is the capital of France?"


def tokens_of(frames, rid):
    return [f for f in frames if f["type"] == "token" and f["id"] == rid]


# --- streaming ------------------------------------------------------------------------------


def test_two_clients_chat_at_once_and_both_stream(live, connect):
    spans = {}

    def user(name):
        ws = connect()
        ws.hello(name)
        ws.chat("r1", "Tell me a story about the sea.", max_tokens=40, ignore_eos=True)
        frames, times = [], []
        while not frames or frames[-1]["type"] != "done":
            frames.append(ws.recv(60))
            times.append(time.monotonic())
        tokens = [t for f, t in zip(frames, times, strict=True) if f["type"] == "token"]
        spans[name] = (frames, tokens[0], tokens[-1])

    threads = [threading.Thread(target=user, args=(n,)) for n in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for frames, _, _ in spans.values():
        assert frames[0]["type"] == "queued"
        assert len(tokens_of(frames, "r1")) >= 5
        assert frames[-1]["usage"]["completion_tokens"] >= 5
    (_, a0, a1), (_, b0, b1) = spans.values()
    assert a0 < b1 and b0 < a1, "both streams were live at the same time"
    live.wait_idle()


def test_cancel_mid_stream_ends_with_cancelled(live, connect):
    ws = connect()
    ws.hello("dave")
    ws.chat("long", QUESTION, max_tokens=500, ignore_eos=True)
    ws.until(lambda f: f["type"] == "token")
    ws.send({"type": "cancel", "id": "long"})
    done = ws.until_done("long")[-1]
    assert done["finish_reason"] == "cancelled"
    assert done["usage"]["completion_tokens"] < 500
    live.wait_idle()


def test_a_cancel_mid_prefill_ends_with_no_token_and_no_ttft(live, connect):
    """The cancel lands while the prompt (~2,700 tokens: 11 chunks of 256) is prefilled."""
    ws = connect()
    ws.hello("ivan")
    ws.chat("long", "tell me more " * 900, max_tokens=50)
    row = wait_until(lambda: prefilling(live, "ivan"), 30, "its prefill under way")
    ws.send({"type": "cancel", "id": "long"})
    frames = ws.until_done("long")
    done = frames[-1]
    assert row.computed_tokens + 4 * 256 < row.prompt_tokens, row  # chunks to go when sent
    assert done["finish_reason"] == "cancelled" and not tokens_of(frames, "long")
    assert done["usage"]["completion_tokens"] == 0 and done["timings"]["ttft_ms"] is None
    live.wait_idle()


def test_disconnect_mid_stream_frees_the_cells(live, connect):
    ws = connect()
    ws.hello("erin")
    ws.chat("r", QUESTION, max_tokens=500, ignore_eos=True)
    ws.until(lambda f: f["type"] == "token")
    snap = live.snapshot()
    assert snap.kv_live > 0
    ws.close()
    snap = live.wait_idle()  # only cached prefixes are left: evicted on demand
    assert snap.kv_used == snap.kv_committed == snap.kv_cached
    assert not live.server.admission.requests


def test_stop_string_is_not_streamed(connect):
    ws = connect()
    ws.hello("gina")
    ws.chat("free", QUESTION, max_tokens=20)
    free = "".join(f["text"] for f in tokens_of(ws.until_done("free"), "free"))
    word = free.split()[1]
    ws.chat("stopped", QUESTION, max_tokens=20, stop=[word])
    frames = ws.until_done("stopped")
    text = "".join(f["text"] for f in tokens_of(frames, "stopped"))
    assert word not in text and frames[-1]["finish_reason"] == "stop"


# --- bad input: an error frame, and the connection goes on ----------------------------------


# --- limits and access -------------------------------------------------------------------------


# --- HTTP --------------------------------------------------------------------------------------


def test_ignore_eos_also_ignores_the_formats_end_of_turn(connect):
    ws = connect()
    ws.hello("quinn")
    ws.chat("fixed", QUESTION, max_tokens=40, ignore_eos=True)
    done = ws.until_done("fixed")[-1]
    assert done["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 40


# --- soak ---------------------------------------------------------------------------------------


# --- the command ---------------------------------------------------------------------------------


def test_serve_shuts_down_gracefully_on_sigterm(tmp_path):
    import os
    import re
    import signal
    import subprocess
    import sys

    from localserve.bench.blocking_ws import WS

    config = tmp_path / "models.toml"
    # the template format adds no stop string: the reply runs until cancelled
    config.write_text(
        '[models.gemma-3-270m]\nembedded = true\nchat_format = "template"\n'
        'chat_template = "gemma"\nn_ctx = 4096\n[server]\nshutdown_grace_s = 1\n'
    )
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "localserve", "--config", str(config), "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        lines = iter(proc.stdout.readline, "")  # the start-up block comes first
        port = next(m[1] for line in lines if (m := re.search(r"ws://127.0.0.1:(\d+)", line)))
        ws = WS(f"ws://127.0.0.1:{port}")
        ws.hello("zoe")
        ws.chat("long", QUESTION, max_tokens=2000, ignore_eos=True, stop=[])
        ws.until(lambda f: f["type"] == "token")
        proc.send_signal(signal.SIGTERM)
        notice = ws.until(lambda f: f["type"] == "notice", timeout=30)[-1]
        assert notice["code"] == "shutting_down"
        ws.chat("late", QUESTION, max_tokens=4)  # a new chat, while the long one goes on
        frames = ws.until_done("long", timeout=30)
        refused = [f for f in frames if f["type"] == "error" and f.get("id") == "late"]
        assert refused and refused[0]["code"] == "shutting_down", frames[-3:]
        assert frames[-1]["finish_reason"] == "cancelled"  # past the 1 s grace period
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(10)
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1001, "server shutting down")
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- prefix caching through the server ---------------------------------------------------------

TURNS = [
    "What is the capital of France?",
    "And what river flows through that city?",
    "Name a famous museum there.",
    "What is painted on its most famous canvas?",
    "Thank you. Summarise our conversation in one sentence.",
]


def converse(ws, rid: str, messages: list[dict]) -> tuple[str, dict]:
    ws.send({"type": "chat", "id": rid, "messages": messages, "max_tokens": 24, "temperature": 0})
    frames = ws.until_done(rid)
    return "".join(f["text"] for f in tokens_of(frames, rid)), frames[-1]["usage"]


def test_a_five_turn_conversation_prefills_only_its_new_tokens(live, connect):
    ws = connect()
    ws.hello("gina")
    messages, usages = [], []
    for i, question in enumerate(TURNS):
        messages.append({"role": "user", "content": question})
        reply, usage = converse(ws, f"t{i}", messages)
        messages.append({"role": "assistant", "content": reply})
        usages.append(usage)
    runner = live.runner
    for i in range(1, 5):
        before, now = usages[i - 1], usages[i]
        # everything the previous turn's prompt had is reused...
        assert now["cached_tokens"] >= before["prompt_tokens"]
        # ...and what is prefilled is the new question (its reply's tokens, re-tokenized, may
        # differ from the sampled ones at a word or two)
        new = len(runner.tokenize(f"\nUser: {TURNS[i]}\nAssistant:", add_special=False))
        prefilled = now["prompt_tokens"] - now["cached_tokens"]
        assert prefilled <= new + 4, (i, usages)
    assert usages[4]["prompt_tokens"] > 2 * usages[0]["prompt_tokens"]


def test_one_user_never_reuses_another_users_conversation(live, connect):
    text = " ".join(f"item{i} is green;" for i in range(120))  # one long, unusual message
    alice, bob = connect(), connect()
    alice.hello("alice-prefix")
    bob.hello("bob-prefix")
    messages = [{"role": "user", "content": text}]
    _, first = converse(alice, "a1", messages)
    _, other = converse(bob, "b1", messages)
    _, again = converse(alice, "a2", messages)
    preamble = len(live.runner.tokenize(PREAMBLE + "\n\nUser:"))  # the shared system prompt
    assert first["prompt_tokens"] > 300
    assert other["cached_tokens"] <= preamble  # bob prefilled alice's text himself
    assert again["cached_tokens"] == first["prompt_tokens"] - 1  # alice reuses all but one
