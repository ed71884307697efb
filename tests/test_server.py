"""The websocket server against the real model: streaming, errors, limits, access, HTTP."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import msgspec
import pytest
from conftest import configured
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed

from localserve.auth import Access
from localserve.prompt import PREAMBLE
from localserve.protocol import Chat, ClientFrame, Subscribe
from localserve.runner import DecodeError

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


def test_welcome_tells_the_model_and_the_limits(connect):
    welcome = connect().hello("carol")
    assert welcome["type"] == "welcome" and welcome["model"] == "gemma-3-270m"
    assert welcome["n_ctx"] == 4096 and welcome["limits"]["max_frame_bytes"] == 64 * 1024


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


def test_disconnect_mid_stream_frees_the_cells(live, connect):
    ws = connect()
    ws.hello("erin")
    ws.chat("r", QUESTION, max_tokens=500, ignore_eos=True)
    ws.until(lambda f: f["type"] == "token")
    snap = live.snapshot()
    assert snap.kv_committed - snap.kv_cached > 0
    ws.close()
    snap = live.wait_idle()  # only cached prefixes are left: evicted on demand
    assert snap.kv_used == snap.kv_committed == snap.kv_cached and not live.server.requests


def test_several_requests_in_flight_on_one_connection(connect):
    ws = connect()
    ws.hello("frank")
    for rid in ("a", "b", "c"):
        ws.chat(rid, QUESTION, max_tokens=8, ignore_eos=True)
    frames = ws.until(lambda f: f["type"] == "done" and f["id"] == "c")
    frames += [] if sum(f["type"] == "done" for f in frames) == 3 else ws.until_done("a")
    done = {f["id"] for f in frames if f["type"] == "done"}
    assert done == {"a", "b", "c"}


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


def test_bad_frames_get_errors_and_the_connection_keeps_working(live, connect):
    ws = connect()
    ws.chat("early", QUESTION)
    assert ws.recv() == {"type": "error", "code": "unauthorized", "message": "say hello first",
                         "id": "early"}  # fmt: skip
    ws.hello("hank")
    cases = [
        ("{not json", "bad_request"),
        ('{"type": "chat", "id": 5, "messages": []}', "bad_request"),  # wrong type
        ('{"type": "teleport"}', "bad_request"),  # unknown type
        (
            '{"type": "chat", "id": "x", "messages": [{"role": "user", "content": "hi"}], '
            '"temperature": -1}',
            "bad_request",
        ),  # fmt: skip
        (
            '{"type": "chat", "id": "y", "messages": [{"role": "wizard", "content": "hi"}]}',
            "bad_request",
        ),  # fmt: skip
        ("x" * (live.config.max_frame_bytes + 1), "bad_request"),  # oversized frame
        (b"\x00\x01", "bad_request"),  # binary
    ]
    for frame, code in cases:
        ws.send(frame)
        reply = ws.recv()
        assert reply["type"] == "error" and reply["code"] == code, (frame[:40], reply)
    long_text = "word " * 5000  # ~5,000 tokens > n_ctx 4096
    ws.chat("big", long_text)
    reply = ws.recv()
    assert reply["code"] == "too_long" and reply["id"] == "big"
    assert "4096" in reply["message"] and "tokens" in reply["message"]
    ws.chat("dup", QUESTION, max_tokens=30, ignore_eos=True)
    ws.chat("dup", QUESTION, max_tokens=30)
    frames = ws.until_done("dup")
    assert any(f["type"] == "error" and f["id"] == "dup" and "already" in f["message"]
               for f in frames)  # fmt: skip
    assert sum(f["type"] == "done" for f in frames) == 1  # the first one was untouched
    assert frames[-1]["finish_reason"] in ("length", "stop")
    ws.chat("after", QUESTION, max_tokens=4)  # the same connection still chats
    assert ws.until_done("after")[-1]["finish_reason"] in ("length", "stop")


def test_validation_error_names_the_field(connect):
    ws = connect()
    ws.hello("ivan")
    ws.send({"type": "chat", "id": "r", "messages": [], "max_tokens": "many"})
    reply = ws.recv()
    assert reply["code"] == "bad_request" and "max_tokens" in reply["message"]
    assert reply["id"] == "r"


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.one_of(
        st.text(max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
            lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(), kids, max_size=4),
            max_leaves=12,
        ).map(json.dumps),
        st.fixed_dictionaries(
            {"type": st.sampled_from(["hello", "chat", "cancel", "subscribe", "x"])},
            optional={
                "id": st.integers() | st.text(),
                "user": st.integers() | st.text(),
                "messages": st.lists(st.dictionaries(st.text(), st.text())),
                "interval_ms": st.text(),
            },  # fmt: skip
        ).map(json.dumps),
    )
)
def test_arbitrary_frames_never_crash_the_connection(live, frame):
    try:
        decoded = msgspec.json.decode(frame, type=ClientFrame)
    except msgspec.DecodeError:
        decoded = None
    assume(not isinstance(decoded, Chat | Subscribe))  # those may succeed; all else is refused
    ws = _fuzz_connection(live)
    ws.send(frame)
    reply = ws.recv(10)
    assert reply["type"] == "error"
    assert reply["code"] in ("bad_request", "unauthorized", "unknown_id")


_fuzz: dict = {}


def _fuzz_connection(live):
    """One connection shared by every example: it must stay usable.

    It says hello first: before hello a connection gets only a few error frames.
    """
    from conftest import WS

    if "ws" not in _fuzz:
        _fuzz["ws"] = WS(live.url)
        assert _fuzz["ws"].hello("fuzz")["type"] == "welcome"
    return _fuzz["ws"]


# --- limits and access -------------------------------------------------------------------------


def test_busy_when_the_per_user_cap_is_reached(live, connect):
    with configured(live, max_inflight_per_user=2):
        ws = connect()
        ws.hello("judy")
        for rid in ("a", "b", "c"):
            ws.chat(rid, QUESTION, max_tokens=200, ignore_eos=True)
        frames = ws.until(lambda f: f["type"] == "error")
        assert frames[-1]["code"] == "busy" and frames[-1]["id"] == "c"
        for rid in ("a", "b"):
            ws.send({"type": "cancel", "id": rid})
        ws.until(lambda f: f["type"] == "done" and f["id"] in ("a", "b"))
    live.wait_idle()
    assert live.snapshot().counters.rejections >= 1


def test_busy_when_the_global_queue_is_full(live, connect):
    sockets = []
    for i in range(8):  # fill every sequence slot with long generations
        ws = connect()
        ws.hello(f"filler{i}")
        ws.chat("r", QUESTION, max_tokens=400, ignore_eos=True)
        sockets.append(ws)
    for ws in sockets:
        ws.until(lambda f: f["type"] == "token")  # all eight are running
    with configured(live, max_queued=1):
        waiting, late = connect(), connect()
        waiting.hello("w")
        waiting.chat("q", QUESTION, max_tokens=4)
        assert waiting.recv()["type"] == "queued"
        late.hello("late")
        late.chat("q", QUESTION, max_tokens=4)
        reply = late.recv()
        assert reply["type"] == "error" and reply["code"] == "busy"
    for ws in sockets:
        ws.send({"type": "cancel", "id": "r"})
    assert waiting.until_done("q")[-1]["finish_reason"] in ("length", "stop")
    live.wait_idle()


def test_wrong_token_is_unauthorized(live, connect):
    with configured(live, access=Access({"kate": "correct-horse"})):
        ws = connect()
        reply = ws.hello("kate", "battery-staple")
        assert reply["type"] == "error" and reply["code"] == "unauthorized"
        assert connect().hello("mallory")["code"] == "unauthorized"
        assert connect().hello("kate", "correct-horse")["type"] == "welcome"
        assert ws.hello("kate", "guess-2")["code"] == "unauthorized"
        assert ws.hello("kate", "guess-3")["code"] == "unauthorized"
        with pytest.raises(ConnectionClosed):  # three strikes: no guessing on one socket
            ws.recv(5)


def test_stats_of_a_server_with_users_need_the_monitor_token(live, connect):
    with configured(live, access=Access({"kate": "correct-horse"})):
        ws = connect()
        ws.hello("kate", "correct-horse")
        ws.send({"type": "subscribe", "interval_ms": 100})
        assert ws.recv()["code"] == "unauthorized"  # users must not see each other's requests


def test_one_user_cannot_cancel_another_users_request(live, connect):
    alice, bob = connect(), connect()
    alice.hello("alice")
    bob.hello("bob")
    alice.chat("r1", QUESTION, max_tokens=30, ignore_eos=True)
    alice.until(lambda f: f["type"] == "queued")
    bob.send({"type": "cancel", "id": "r1"})
    reply = bob.recv()
    assert reply["code"] == "unknown_id" and reply["id"] == "r1"
    done = alice.until_done("r1")[-1]
    assert done["finish_reason"] in ("length", "stop")  # untouched by bob's attempt


def test_monitor_token_guards_the_stats_stream(live, connect):
    with configured(live, access=Access({}, monitor_token="monitor-secret")):
        ws = connect()
        ws.send({"type": "subscribe", "interval_ms": 100, "token": "wrong"})
        assert ws.recv()["code"] == "unauthorized"
        ws.send({"type": "subscribe", "interval_ms": 100, "token": "monitor-secret"})
        stats = ws.recv()
        assert stats["type"] == "stats" and stats["snapshot"]["kv_total"] == 4096
        ws.send({"type": "subscribe", "interval_ms": 0})


def test_engine_fault_fails_the_request_with_an_error_frame(live, connect, caplog):
    runner = live.runner
    real_run = runner.run
    failed = threading.Event()

    def broken(batch):
        if not failed.is_set():
            failed.set()
            raise DecodeError("llama_decode returned -3")
        return real_run(batch)

    runner.run = broken
    try:
        ws = connect()
        ws.hello("olga")
        ws.chat("r", QUESTION, max_tokens=5)
        frames = ws.until_done("r")
    finally:
        del runner.run
    assert any(f["type"] == "error" and f["code"] == "internal" and f["id"] == "r" for f in frames)
    assert frames[-1]["finish_reason"] == "error"
    ws.chat("again", QUESTION, max_tokens=3)  # and the server goes on
    assert ws.until_done("again")[-1]["finish_reason"] in ("length", "stop")


# --- HTTP --------------------------------------------------------------------------------------


def test_healthz_is_json(live):
    with urllib.request.urlopen(live.http + "/healthz", timeout=10) as response:
        assert response.headers["Content-Type"] == "application/json"
        body = json.load(response)
    assert body == {"ok": True, "model": "gemma-3-270m", "backend": "CPU", "running": 0,
                    "waiting": 0}  # fmt: skip


def test_ignore_eos_also_ignores_the_formats_end_of_turn(connect):
    ws = connect()
    ws.hello("quinn")
    ws.chat("fixed", QUESTION, max_tokens=40, ignore_eos=True)
    done = ws.until_done("fixed")[-1]
    assert done["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 40


def test_metrics_parse_as_prometheus_text(live, connect):
    from prometheus_client.parser import text_string_to_metric_families

    ws = connect()
    ws.hello("pat")
    ws.chat("r", QUESTION, max_tokens=5)
    ws.until_done("r")
    with urllib.request.urlopen(live.http + "/metrics", timeout=10) as response:
        text = response.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                 "request_queue_time_seconds", "e2e_request_latency_seconds"):  # fmt: skip
        family = families[f"localserve:{name}"]
        assert family.type == "histogram"
        count = next(s.value for s in family.samples if s.name.endswith("_count"))
        assert count >= 1
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert families[f"localserve:{name}"].type == "gauge"
    for name in ("prompt_tokens", "generation_tokens", "num_preemptions"):
        assert families[f"localserve:{name}"].type == "counter"
    assert "user" not in text


# --- soak ---------------------------------------------------------------------------------------


def test_soak_twenty_clients_two_hundred_requests(live):
    from conftest import WS

    tasks_before = live.call(_count_tasks())
    outcomes: dict[str, str] = {}
    lock = threading.Lock()

    def client(i: int) -> None:
        ws = WS(live.url)
        ws.hello(f"soak{i}")
        for j in range(10):
            rid = f"r{j}"
            ws.chat(rid, f"Question {i}-{j}: {QUESTION}", max_tokens=3 + (i + j) % 5)
            frame = ws.until(
                lambda f, rid=rid: f.get("id") == rid and f["type"] in ("done", "error")
            )[-1]
            with lock:
                outcomes[f"{i}/{j}"] = frame.get("finish_reason") or frame["code"]
        ws.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(outcomes) == 200
    assert set(outcomes.values()) <= {"length", "stop", "busy"}
    snap = live.wait_idle()
    assert snap.kv_used == snap.kv_committed == snap.kv_cached
    server = live.server
    assert not server.requests and server.counts.waiting == 0
    assert not server.counts.inflight_per_user and not live.engine._seqs
    time.sleep(0.3)  # closed connections finish their handlers
    assert live.call(_count_tasks()) <= tasks_before


async def _count_tasks() -> int:
    import asyncio

    return len(asyncio.all_tasks())


# --- the command ---------------------------------------------------------------------------------


def test_serve_shuts_down_gracefully_on_sigterm(tmp_path):
    import os
    import re
    import signal
    import subprocess
    import sys

    from conftest import WS

    config = tmp_path / "models.toml"
    # the template format adds no stop string: the reply runs until cancelled
    config.write_text(
        '[models.gemma-3-270m]\nembedded = true\nchat_format = "template"\n'
        'chat_template = "gemma"\nn_ctx = 4096\n[server]\nshutdown_grace_s = 1\n'
    )
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "localserve", "--config", str(config), "serve", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        lines = iter(proc.stdout.readline, "")  # the start-up block comes first
        port = next(m[1] for line in lines if (m := re.search(r"ws://127.0.0.1:(\d+)", line)))
        ws = WS(f"ws://127.0.0.1:{port}")
        ws.hello("zoe")
        ws.chat("long", QUESTION, max_tokens=2000, ignore_eos=True, stop=[])
        ws.until(lambda f: f["type"] == "token")
        proc.send_signal(signal.SIGTERM)
        frames = ws.until_done("long", timeout=30)
        assert any(f["type"] == "notice" and f["code"] == "shutting_down" for f in frames)
        assert frames[-1]["finish_reason"] == "cancelled"  # past the 1 s grace period
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
    ws.send({"type": "chat", "id": rid, "messages": messages, "max_tokens": 24,
             "temperature": 0})  # fmt: skip
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
