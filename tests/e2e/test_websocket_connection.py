"""One websocket connection (localserve/serve/websocket/connection.py) on a server over the
FakeRunner: frames in,
errors out, limits, access, and clients that stop reading. Nothing here needs the model's text;
the real-model paths are in test_websocket_server.py and test_hostile_clients.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import urllib.error
import urllib.request

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed, InvalidStatus

from localserve.bench.blocking_ws import WS
from localserve.bench.fake_server import FakeServer
from localserve.bench.hostile import RawClient
from localserve.engine.runner import DecodeError
from localserve.ops.auth import Access
from localserve.protocol.frames import Chat, ClientFrame, Subscribe
from localserve.serve.transport import PlaceLog
from localserve.serve.websocket.connection import MAX_OUTBOX_FRAMES
from tests.support.clients import Streamer
from tests.support.fakes import WideRunner
from tests.support.live import configured
from tests.support.waiting import wait_until

QUESTION = "What is the capital of France?"


@pytest.fixture
def connect(fake):
    opened: list[WS] = []

    def make() -> WS:
        opened.append(WS(fake.url))
        return opened[-1]

    yield make
    for ws in opened:
        ws.close()


@pytest.fixture
def bob(fake):
    """bob streams whole replies all the while: whatever another client does, he must not
    notice (see test_hostile_clients.py)."""
    streamer = Streamer(fake)
    yield streamer
    streamer.finish()
    fake.wait_idle()


def tokens_of(frames, rid):
    return [f for f in frames if f["type"] == "token" and f["id"] == rid]


def chat(rid: str, text: str, **fields) -> dict:
    return {"type": "chat", "id": rid, "messages": [{"role": "user", "content": text}]} | fields


# --- a client that stops reading --------------------------------------------------------------


def never_reading_client(server, frames: list[dict], timeout: float = 60.0) -> list[dict]:
    """Run one websocket through the server's ASGI app with a client that reads nothing: the
    first frame written to it never completes. Returns every message the server sent."""

    async def session() -> list[dict]:
        incoming: asyncio.Queue = asyncio.Queue()
        sent: list[dict] = []

        async def receive():
            return await incoming.get()

        async def send(message):
            sent.append(message)
            if message["type"] == "websocket.send":
                await asyncio.Event().wait()  # the socket is full: this write never ends
            elif message["type"] == "websocket.close":
                incoming.put_nowait({"type": "websocket.disconnect", "code": message["code"]})

        for frame in frames:
            incoming.put_nowait({"type": "websocket.receive", "text": json.dumps(frame)})
        scope = {"type": "websocket", "path": "/", "headers": [], "client": ("127.0.0.1", 5)}
        await asyncio.wait_for(server.server.app(scope, receive, send), timeout)
        return sent

    return server.call(session(), timeout=timeout + 5)


def test_a_reader_that_stops_reading_is_closed_at_the_byte_limit_and_its_requests_cancelled():
    """Four long replies on a real socket that nobody reads: once the socket is full, their
    text waits in the outbox, coalesced (one frame per request), until it passes
    max_outbox_bytes (256 KiB). The close frame waits behind what the socket holds: the client
    reads it once the server has given up."""
    runner = WideRunner(n_ctx=4 * 4200, n_seq_max=4, step_s=0)
    server = FakeServer(runner=runner, write_timeout_s=600)
    try:
        client = RawClient(server.url)
        client.send({"type": "hello", "user": "sponge"})
        for i in range(4):
            client.send(chat(f"c{i}", f"story {i}", max_tokens=4096, ignore_eos=True))

        def seen():  # connected, or already closed: with step_s=0 the outbox can pass its limit
            # before the first look (the connection is dropped when its close starts)
            return server.connections_of("sponge") or server.snapshot().counters.cancellations

        wait_until(seen, 30, "sponge connected")
        wait_until(lambda: not server.connections_of("sponge"), 30, "sponge closed")
        limit = server.config.max_outbox_bytes
        assert client.close_frame() == (1008, f"not reading: over {limit} bytes unsent")
        client.close()
        snap = server.wait_idle()  # every reply was cancelled, its cells freed
        assert snap.counters.finished == snap.counters.cancellations == 4
        assert not server.server.admission.requests and not server.server.connections
    finally:
        server.close()


def test_a_socket_that_takes_nothing_for_write_timeout_s_is_closed_with_1008():
    """A reply that fills the socket within a moment, then the write waits: 1008 after
    write_timeout_s, read from the socket. (A socket filled slower than the kernel's user
    timeout, write_timeout_s + 2 s, is cut by the kernel first, with no close frame.)"""
    runner = WideRunner(step_s=0.001)  # 2 MB of text a second
    server = FakeServer(runner=runner, write_timeout_s=1.0, max_outbox_bytes=64 << 20)
    try:
        client = RawClient(server.url)
        client.send({"type": "hello", "user": "clog"})
        client.send(chat("c", "a long story", max_tokens=4000, ignore_eos=True))
        wait_until(lambda: server.connections_of("clog"), 30, "clog connected")
        wait_until(lambda: not server.connections_of("clog"), 30, "clog closed")
        assert client.close_frame() == (1008, "not reading for 1 s")
        client.close()
        assert server.wait_idle().counters.cancellations == 1
    finally:
        server.close()


def test_a_reader_that_stops_reading_is_closed_at_the_frame_limit(fake):
    n = MAX_OUTBOX_FRAMES + 10  # each earns an error frame (not coalesced)
    frames = [{"type": "hello", "user": "deaf"}]
    frames += [{"type": "cancel", "id": f"n{i}"} for i in range(n)]
    sent = never_reading_client(fake, frames)
    close = sent[-1]
    assert close["type"] == "websocket.close" and close["code"] == 1008
    assert close["reason"] == f"not reading: over {MAX_OUTBOX_FRAMES} frames unsent"
    assert not fake.connections_of("deaf")


# --- moved from test_websocket_server.py: the protocol on the fake ----------------------------


def test_welcome_tells_the_model_and_the_limits(connect):
    welcome = connect().hello("carol")
    assert welcome["type"] == "welcome" and welcome["model"] == "fake"
    assert welcome["n_ctx"] == 4096 and welcome["limits"]["max_frame_bytes"] == 64 * 1024


def test_several_requests_in_flight_on_one_connection(connect):
    ws = connect()
    ws.hello("frank")
    for rid in ("a", "b", "c"):
        ws.chat(rid, QUESTION, max_tokens=8, ignore_eos=True)
    frames = ws.until(lambda f: f["type"] == "done" and f["id"] == "c")
    frames += [] if sum(f["type"] == "done" for f in frames) == 3 else ws.until_done("a")
    done = {f["id"] for f in frames if f["type"] == "done"}
    assert done == {"a", "b", "c"}


def test_bad_frames_get_errors_and_the_connection_keeps_working(fake, connect):
    ws = connect()
    ws.chat("early", QUESTION)
    assert ws.recv() == {
        "type": "error",
        "code": "unauthorized",
        "message": "say hello first",
        "id": "early",
    }
    ws.hello("hank")
    cases = [
        ("{not json", "bad_request"),
        ('{"type": "chat", "id": 5, "messages": []}', "bad_request"),  # wrong type
        ('{"type": "teleport"}', "bad_request"),  # unknown type
        (
            '{"type": "chat", "id": "x", "messages": [{"role": "user", "content": "hi"}], '
            '"temperature": -1}',
            "bad_request",
        ),
        (
            '{"type": "chat", "id": "y", "messages": [{"role": "wizard", "content": "hi"}]}',
            "bad_request",
        ),
        ("x" * (fake.config.max_frame_bytes + 1), "bad_request"),  # oversized frame
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
    assert any(
        f["type"] == "error" and f["id"] == "dup" and "already" in f["message"] for f in frames
    )
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
            },
        ).map(json.dumps),
    )
)
def test_arbitrary_frames_never_crash_the_connection(fake, frame):
    try:
        decoded = msgspec.json.decode(frame, type=ClientFrame)
    except msgspec.DecodeError:
        decoded = None
    assume(not isinstance(decoded, Chat | Subscribe))  # those may succeed; all else is refused
    ws = _fuzz_connection(fake)
    ws.send(frame)
    reply = ws.recv(10)
    assert reply["type"] == "error"
    assert reply["code"] in ("bad_request", "unauthorized", "unknown_id")


_fuzz: dict = {}


def _fuzz_connection(fake):
    """One connection shared by every example: it must stay usable.

    It says hello first: before hello a connection gets only a few error frames.
    """
    if "ws" not in _fuzz:
        _fuzz["ws"] = WS(fake.url)
        assert _fuzz["ws"].hello("fuzz")["type"] == "welcome"
    return _fuzz["ws"]


def test_busy_when_the_per_user_cap_is_reached(fake, connect, monkeypatch):
    monkeypatch.setattr(fake.runner, "step_s", 0.02)  # the long replies outlast the test
    with configured(fake, max_inflight_per_user=2):
        ws = connect()
        ws.hello("judy")
        for rid in ("a", "b", "c"):
            ws.chat(rid, QUESTION, max_tokens=200, ignore_eos=True)
        frames = ws.until(lambda f: f["type"] == "error")
        assert frames[-1]["code"] == "busy" and frames[-1]["id"] == "c"
        for rid in ("a", "b"):
            ws.send({"type": "cancel", "id": rid})
        ws.until(lambda f: f["type"] == "done" and f["id"] in ("a", "b"))
    fake.wait_idle()
    assert fake.snapshot().counters.rejections >= 1


def test_busy_when_the_global_queue_is_full(fake, connect, monkeypatch):
    monkeypatch.setattr(fake.runner, "step_s", 0.02)  # the long replies outlast the test
    sockets = []
    for i in range(8):  # fill every sequence slot with long generations
        ws = connect()
        ws.hello(f"filler{i}")
        ws.chat("r", QUESTION, max_tokens=400, ignore_eos=True)
        sockets.append(ws)
    for ws in sockets:
        ws.until(lambda f: f["type"] == "token")  # all eight are running
    with configured(fake, max_queued=1):
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
    fake.wait_idle()


def test_wrong_token_is_unauthorized(fake, connect):
    with configured(fake, access=Access({"kate": "correct-horse"})):
        ws = connect()
        reply = ws.hello("kate", "battery-staple")
        assert reply["type"] == "error" and reply["code"] == "unauthorized"
        assert connect().hello("mallory")["code"] == "unauthorized"
        assert connect().hello("kate", "correct-horse")["type"] == "welcome"
        assert ws.hello("kate", "guess-2")["code"] == "unauthorized"
        assert ws.hello("kate", "guess-3")["code"] == "unauthorized"
        with pytest.raises(ConnectionClosed):  # three strikes: no guessing on one socket
            ws.recv(5)


def test_stats_of_a_server_with_users_need_the_monitor_token(fake, connect):
    with configured(fake, access=Access({"kate": "correct-horse"})):
        ws = connect()
        ws.hello("kate", "correct-horse")
        ws.send({"type": "subscribe", "interval_ms": 100})
        reply = ws.recv()  # users must not see each other's requests
        assert reply["code"] == "unauthorized"
        assert reply["message"] == "stats need the server's monitor token: none was sent"


def test_one_user_cannot_cancel_another_users_request(fake, connect):
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


def test_monitor_token_guards_the_stats_stream(fake, connect):
    with configured(fake, access=Access({}, monitor_token="monitor-secret")):
        ws = connect()
        ws.send({"type": "subscribe", "interval_ms": 100, "token": "wrong"})
        reply = ws.recv()
        assert reply["code"] == "unauthorized"
        assert reply["message"] == "stats need the server's monitor token: the one sent is wrong"
        ws.send({"type": "subscribe", "interval_ms": 100, "token": "monitor-secret"})
        stats = ws.recv()
        assert stats["type"] == "stats" and stats["snapshot"]["kv_total"] == 4096
        ws.send({"type": "subscribe", "interval_ms": 0})


def test_engine_fault_fails_the_request_with_an_error_frame(fake, connect, caplog):
    runner = fake.runner
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


def test_healthz_is_json(fake):
    with urllib.request.urlopen(fake.http + "/healthz", timeout=30) as response:
        assert response.headers["Content-Type"] == "application/json"
        body = json.load(response)
    assert body.items() >= {"ok": True, "model": "fake", "backend": "CPU", "running": 0}.items()
    assert body["waiting"] == 0 and body["tokens"] is False
    assert body["kv_total"] == 4096 and body["kv_used"] >= body["kv_cached"] >= 0


def test_metrics_parse_as_prometheus_text(fake, connect):
    from prometheus_client.parser import text_string_to_metric_families

    ws = connect()
    ws.hello("pat")
    ws.chat("r", QUESTION, max_tokens=5)
    ws.until_done("r")
    with urllib.request.urlopen(fake.http + "/metrics", timeout=30) as response:
        text = response.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "request_queue_time_seconds",
        "e2e_request_latency_seconds",
    ):
        family = families[f"localserve:{name}"]
        assert family.type == "histogram"
        count = next(s.value for s in family.samples if s.name.endswith("_count"))
        assert count >= 1
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert families[f"localserve:{name}"].type == "gauge"
    for name in ("prompt_tokens", "generation_tokens", "num_preemptions"):
        assert families[f"localserve:{name}"].type == "counter"
    assert "user" not in text


def test_soak_twenty_clients_two_hundred_requests(fake):
    tasks_before = fake.call(_count_tasks())
    outcomes: dict[str, str] = {}
    lock = threading.Lock()

    def client(i: int) -> None:
        ws = WS(fake.url)
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
    snap = fake.wait_idle()
    assert snap.kv_used == snap.kv_committed == snap.kv_cached
    server = fake.server
    assert not server.admission.requests and server.admission.counts.waiting == 0
    assert not server.admission.counts.inflight_per_user and not fake.engine._seqs
    # closed connections finish their handlers
    wait_until(lambda: fake.call(_count_tasks()) <= tasks_before, 30, "handlers finished")


async def _count_tasks() -> int:
    import asyncio

    return len(asyncio.all_tasks())


# --- moved from test_hostile_clients.py: hostile input while bob streams ----------------------


def test_error_frames_quote_at_most_a_little_of_the_input(fake, connect, bob):
    ws = connect()
    ws.hello("mallory")
    huge = "k" * (fake.config.max_frame_bytes - 100)
    ws.send(f'{{"type": "chat", "id": "r", "{huge}": 1}}')
    reply = ws.recv()
    assert reply["code"] == "bad_request" and reply["id"] == "r"
    assert "unknown field" in reply["message"] and len(reply["message"]) <= 250
    ws.send({"type": "chat", "id": "i" * 5000, "messages": [{"role": "user", "content": "x"}]})
    reply = ws.recv()
    assert reply["code"] == "bad_request" and "id" not in reply  # never echoed
    ws.send({"type": "chat", "id": "r2", "messages": [{"role": huge[:5000], "content": "x"}]})
    reply = ws.recv()
    assert reply["code"] == "bad_request" and len(reply["message"]) <= 250


def test_before_hello_a_connection_gets_three_errors_then_is_closed(fake, connect, bob):
    ws = connect()
    for _ in range(3):
        ws.send("{not json")
        assert ws.recv()["code"] == "bad_request"
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(5)
    assert closed.value.rcvd.code == 1008


def test_connections_closed_before_hello_are_one_log_line_per_place(fake, caplog):
    """Anyone can open connections and earn three errors on each: one line, not one each."""
    limits = fake.server.limits
    real, limits.log = limits.log, PlaceLog(clock=lambda: 0.0)
    try:
        with caplog.at_level(logging.WARNING, logger="localserve.serve.websocket.connection"):
            for _ in range(5):
                client = RawClient(fake.url)
                for _ in range(3):
                    client.send("{not json")
                assert client.close_frame() == (1008, "too many errors before hello")
                client.close()
    finally:
        limits.log = real
    lines = [
        r.getMessage() for r in caplog.records if r.name == "localserve.serve.websocket.connection"
    ]
    assert len(lines) == 1 and "too many errors before hello" in lines[0], lines


def test_inputs_that_used_to_end_in_1011_get_error_frames(fake, connect, bob):
    ws = connect()
    ws.send("[" * 2000 + "]" * 2000)  # a RecursionError while recovering the frame's id
    assert ws.recv()["code"] == "bad_request"
    ws.send('{"type": "chat", "id": "deep", "messages": ' + "[" * 2000 + "]" * 2000 + "}")
    assert ws.recv()["code"] == "bad_request"
    ws = connect()
    ws.send('{"type": "subscribe", "interval_ms": 1' + "0" * 400 + "}")  # OverflowError
    reply = ws.recv()
    assert reply["code"] == "bad_request" and "interval_ms" in reply["message"]
    ws.send({"type": "subscribe", "interval_ms": 0})  # the connection goes on
    ws.hello("erin")
    ws.chat("ok", QUESTION, max_tokens=2)
    assert ws.until_done("ok")[-1]["finish_reason"] in ("stop", "length")


def test_non_ascii_tokens_are_compared_as_bytes(fake, connect, bob):
    access = Access({"zoë": "grüße-für-zoë", "kate": "correct-horse"}, monitor_token="mönitor-ß")
    with configured(fake, access=access):
        ws = connect()
        assert ws.hello("kate", "cörrect-hörse")["code"] == "unauthorized"  # not a TypeError
        assert ws.hello("zoë", "grüße-für-zoë")["type"] == "welcome"
        ws.send({"type": "subscribe", "interval_ms": 0, "token": "mönitor-x"})
        assert ws.recv()["code"] == "unauthorized"
        ws.send({"type": "subscribe", "interval_ms": 100, "token": "mönitor-ß"})
        assert ws.recv()["type"] == "stats"
        ws.send({"type": "subscribe", "interval_ms": 0})


def test_a_failure_while_handling_a_frame_is_an_internal_error(fake, connect, bob):
    server = fake.server
    real = server.admission.submit

    async def broken(*args):
        raise RuntimeError("boom")

    ws = connect()
    ws.hello("ivy")
    server.admission.submit = broken
    try:
        ws.chat("x", QUESTION)
        reply = ws.recv()
    finally:
        server.admission.submit = real
    assert reply["type"] == "error" and reply["code"] == "internal"
    ws.chat("y", QUESTION, max_tokens=2)  # the connection lives on
    assert ws.until_done("y")[-1]["finish_reason"] in ("stop", "length")


def test_failed_authentication_is_throttled_per_address_and_user(fake, connect, bob):
    access = Access({"kate": "correct-horse", "liz": "battery-staple"}, monitor_token="m-secret")
    with configured(fake, access=access, max_auth_failures_per_minute=5) as server:
        throttle = server.admission.authentication.throttle
        throttle.window_s = 5.0  # once locked, a turn a second rather than every 5 s
        for i in range(5):  # fresh sockets each time: the per-socket limit does not help
            assert connect().hello("kate", f"guess-{i}")["code"] == "unauthorized"
        reply = connect().hello("kate", "guess-5")  # a sixth guess waits its turn, refused
        assert reply["code"] == "unauthorized" and "try again in" in reply["message"]
        assert connect().hello("kate", "correct-horse")["type"] == "welcome"  # right: it passes
        assert connect().hello("liz", "battery-staple")["type"] == "welcome"  # others sign in
        metrics = fake.http + "/metrics"
        good = urllib.request.Request(metrics, headers={"Authorization": "Bearer m-secret"})
        assert urllib.request.urlopen(good, timeout=30).status == 200
        for i in range(6):
            wrong = urllib.request.Request(metrics, headers={"Authorization": f"Bearer m{i}"})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(wrong, timeout=30)
            assert refused.value.code == (401 if i < 5 else 429)
        assert int(refused.value.headers["Retry-After"]) > 0
        # the monitor token passed before the guessing: it skips the turn (not throttled)
        assert urllib.request.urlopen(good, timeout=30).status == 200
        assert throttle.num_failures == 12 and throttle.num_throttled == 3
        throttle.clock = lambda: time.monotonic() + 61  # a minute later
        assert connect().hello("kate", "correct-horse")["type"] == "welcome"
        text = urllib.request.urlopen(good, timeout=30).read().decode()
        assert 'localserve:auth_failures_total{model_name="fake"} 12' in text
        assert 'localserve:auth_throttled_total{model_name="fake"} 3' in text


def test_guessing_from_other_loopback_addresses_counts_as_one_place(fake, bob):
    with configured(
        fake, access=Access({"kate": "correct-horse"}), max_auth_failures_per_minute=3
    ) as server:

        def hello(source: str, token: str) -> dict:
            client = RawClient(fake.url, source=source)
            client.send({"type": "hello", "user": "kate", "token": token})
            reply = client.recv()
            client.close()
            return reply

        server.admission.authentication.throttle.window_s = 3.0  # once locked, a turn a second
        for i in range(3):
            assert hello(f"127.0.0.{i + 2}", f"guess-{i}")["code"] == "unauthorized"
        assert "try again in" in hello("127.0.0.9", "guess-3")["message"]
        assert hello("127.0.0.10", "correct-horse")["type"] == "welcome"
        assert server.admission.authentication.throttle.num_failures == 4


def test_metrics_follow_the_stats_rule(fake, bob):
    with configured(fake, access=Access({"kate": "correct-horse"}, monitor_token="m-secret")):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "m-secret"}):
            request = urllib.request.Request(fake.http + "/metrics", headers=headers)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert refused.value.code == 401
            assert refused.value.headers["WWW-Authenticate"].startswith("Bearer")
        request = urllib.request.Request(
            fake.http + "/metrics", headers={"Authorization": "Bearer m-secret"}
        )
        assert b"localserve:engine_steps_total" in urllib.request.urlopen(request).read()
    assert b"engine_steps_total" in urllib.request.urlopen(fake.http + "/metrics").read()


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS", "PATCH"])
def test_every_http_method_but_get_is_405(fake, method):
    for path, body in (("/healthz", None), ("/metrics", b"x=1"), ("/", b'{"a": 1}')):
        request = urllib.request.Request(fake.http + path, data=body, method=method)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 405 and "GET" in refused.value.headers["Allow"]
    assert urllib.request.urlopen(fake.http + "/healthz", timeout=30).status == 200


def test_a_connection_must_say_hello_or_subscribe_soon(fake, monkeypatch, bob):
    import localserve.serve.websocket.connection

    monkeypatch.setattr(localserve.serve.websocket.connection, "HELLO_TIMEOUT_S", 0.5)
    silent, monitor = WS(fake.url), WS(fake.url)
    monitor.send({"type": "subscribe", "interval_ms": 200})
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            silent.recv(5)
    assert closed.value.rcvd.code == 1008 and "hello" in closed.value.rcvd.reason
    assert monitor.recv()["type"] == "stats" and monitor.recv()["type"] == "stats"
    monitor.close()


def test_health_and_metrics_answer_when_the_connections_are_all_taken(fake, connect, bob):
    with configured(fake, max_connections=1):  # bob holds it
        assert urllib.request.urlopen(fake.http + "/healthz", timeout=30).status == 200
        assert urllib.request.urlopen(fake.http + "/metrics", timeout=30).status == 200
        with pytest.raises(InvalidStatus) as refused:
            connect()
        response = refused.value.response
        assert response.status_code == 503 and response.headers["Retry-After"] == "5"


def speaking(fake) -> list:
    """The server's connections that said hello or subscribed."""

    async def find() -> list:
        return [c for c in fake.server.connections if not c.is_silent]

    return fake.call(find())


def test_connections_that_said_no_hello_count_for_no_max_connections(fake, connect, bob):
    # bob's and the fuzzer's stay; the earlier tests' must be gone
    stays = lambda: all(c.user in ("bob", "fuzz") for c in speaking(fake))  # noqa: E731
    wait_until(stays, 30, "the earlier tests' connections gone")
    with configured(fake, max_connections=len(speaking(fake)) + 1):  # room for one
        silent = [connect() for _ in range(3)]  # none of them counts yet
        assert silent[0].hello("una")["type"] == "welcome"  # the second
        refused = silent[1].hello("ulla")
        assert refused["code"] == "busy" and "max_connections" in refused["message"]
        silent[2].send({"type": "subscribe", "interval_ms": 100})
        assert silent[2].recv()["code"] == "busy"
        with pytest.raises(InvalidStatus):
            connect()


def test_one_user_past_max_connections_per_user_leaves_room_for_the_others(fake, connect):
    """alice opens every socket the server takes, with her own token: past her cap her hello is
    refused, saying so, and bob still gets in (on a server without the cap: a 503 for him)."""
    wait_until(lambda: not any(c.user == "alice" for c in speaking(fake)), 30, "no alice yet")
    access = Access({"alice": "alice-secret", "bob": "bob-secret"})
    room = len(speaking(fake)) + 3  # alice's two and bob's
    with configured(fake, access=access, max_connections=room, max_connections_per_user=2):
        alices = [connect() for _ in range(3)]
        assert [ws.hello("alice", "alice-secret")["type"] for ws in alices[:2]] == ["welcome"] * 2
        refused = alices[2].hello("alice", "alice-secret")
        assert refused["code"] == "busy" and "max_connections_per_user = 2" in refused["message"]
        assert "retry_after_s" not in refused  # waiting does not pass it: closing one does
        bob = connect()  # her refused socket counts for nobody
        assert bob.hello("bob", "bob-secret")["type"] == "welcome"
        alices[0].close()
        wait_until(lambda: len(speaking(fake)) < room, 30, "alice's first socket gone")
        assert alices[2].hello("alice", "alice-secret")["type"] == "welcome"


def test_on_a_server_without_users_the_cap_is_the_name_in_hello(fake, connect):
    with configured(fake, max_connections_per_user=1):
        first, second = connect(), connect()
        assert first.hello("olga")["type"] == "welcome"
        refused = second.hello("olga")
        assert refused["code"] == "busy" and "'olga'" in refused["message"]
        assert second.hello("olga2")["type"] == "welcome"  # another name is another user


def test_a_far_too_long_prompt_is_refused_before_all_of_it_is_tokenized(fake, connect, bob):
    ws = connect()
    ws.hello("paste")
    ws.chat("p", "word " * 12_000)  # 60,000 characters; the context holds 4,096 tokens
    reply = ws.recv()
    assert reply["code"] == "too_long" and "over" in reply["message"] and "4096" in reply["message"]


def test_long_system_prompts_do_not_fill_the_token_cache(fake, connect, bob):
    cache = fake.server.prompts._system_tokens
    before = cache.cache_info().currsize
    ws = connect()
    ws.hello("sys")
    for i in range(2):  # each system prompt is over the cached size (yet only ~560 tokens)
        system = f"{i}" + " " * 17_000
        ws.send(
            {
                "type": "chat",
                "id": f"s{i}",
                "max_tokens": 1,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": "hi"},
                ],
            }
        )
        ws.until_done(f"s{i}")
    assert cache.cache_info().currsize == before
