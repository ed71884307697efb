"""One hostile user against a real server while another streams: nobody else may notice.

Every test here runs a second user, bob, who streams complete replies (fixed length, greedy)
the whole time the hostile input is sent; each of bob's replies must arrive whole. The server is
the real one on a loopback port with the real model (the `live` fixture).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
import time
import urllib.error
import urllib.request

import pytest
from conftest import WS, configured
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed

from localserve.auth import Access
from localserve.server import FRAME_SLACK_BYTES
from localserve.transport import CLOSE_TIMEOUT_S, FRAME_COST_BYTES

MAX_QUEUED_FRAMES = 1  # uvicorn's websocket protocol stops reading while a message waits

pytestmark = pytest.mark.model

QUESTION = "What is the capital of France?"
BOB_TOKENS = 24


class Streamer:
    """bob: one complete reply after another until stopped; every reply must be whole."""

    def __init__(self, live) -> None:
        self.replies: list[dict] = []  # each reply's done frame
        self.problems: list[dict] = []
        self._stop = threading.Event()
        self._first_token = threading.Event()
        self._ws = WS(live.url)
        assert self._ws.hello("bob")["type"] == "welcome"
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._first_token.wait(60), "bob never got a token"

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            rid = f"bob{n}"
            self._ws.chat(rid, "Tell me about the sea.", max_tokens=BOB_TOKENS, ignore_eos=True)
            text = []
            for frame in self._ws.until_done(rid, timeout=180):
                if frame["type"] == "token":
                    text.append(frame["text"])
                    self._first_token.set()
                elif frame["type"] not in ("queued", "done"):
                    self.problems.append(frame)
            done = frame
            if done["finish_reason"] != "length" or not "".join(text):
                self.problems.append(done)
            self.replies.append(done)

    def finish(self) -> list[dict]:
        """Stop after the reply in flight; check that every reply was whole."""
        self._stop.set()
        self._thread.join(240)
        self._ws.close()
        assert not self._thread.is_alive(), "bob's reply never ended"
        assert not self.problems, self.problems
        assert self.replies and all(
            d["usage"]["completion_tokens"] == BOB_TOKENS for d in self.replies
        )
        return self.replies


@pytest.fixture
def bob(live):
    streamer = Streamer(live)
    yield streamer
    streamer.finish()
    live.wait_idle()


class RawClient:
    """A websocket client on a bare socket: it sends, and reads only when told to.

    Its receive buffer is small, so a server writing to it finds the socket full quickly,
    as it would with any client that stops reading.
    """

    def __init__(
        self, url: str, rcvbuf: int = 4096, source: str | None = None, sndbuf: int | None = None
    ) -> None:
        host, port = url.removeprefix("ws://").rstrip("/").split(":")
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if sndbuf:  # what it can push ahead of the server's reading
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        if source:
            self.sock.bind((source, 0))
        self.sock.settimeout(30)
        self.sock.connect((host, int(port)))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101"), head

    def send(self, frame: dict | str, opcode: int = 0x1) -> bool:
        """One masked frame (a zero mask: valid, and no copying); False once refused."""
        data = (frame if isinstance(frame, str) else json.dumps(frame)).encode()
        n, first = len(data), 0x80 | opcode
        if n < 126:
            head = struct.pack("!BB", first, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", first, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", first, 0x80 | 127, n)
        try:
            self.sock.sendall(head + b"\0\0\0\0" + data)
            return True
        except OSError:  # reset, or the server stopped reading and closed
            return False

    def recv(self) -> dict:
        """The next frame from the server (unmasked, unfragmented text: all it sends)."""
        first, second = self._exactly(2)
        n = second & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", self._exactly(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", self._exactly(8))
        assert first & 0x0F == 0x1, first
        return json.loads(self._exactly(n))

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "connection closed"
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def rss_bytes() -> int:
    """This process's resident memory (the live server runs in it)."""
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def wait_for(predicate, timeout: float, what: str) -> float:
    """Poll until true; return the seconds it took."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)
    return time.monotonic() - start


# --- 1. one request's sampling cannot fail anyone else's step ------------------------------


def test_a_denormal_temperature_is_greedy_and_fails_nobody(live, connect, bob):
    alice = connect()
    alice.hello("alice")
    alice.chat("r", QUESTION, max_tokens=8, temperature=1e-320, ignore_eos=True)
    frames = alice.until_done("r")
    assert frames[-1]["finish_reason"] == "length"
    assert not [f for f in frames if f["type"] == "error"]
    alice.chat("ref", QUESTION, max_tokens=8, temperature=0, ignore_eos=True)
    ref = alice.until_done("ref")
    text = "".join(f["text"] for f in frames if f["type"] == "token")
    assert text and text == "".join(f["text"] for f in ref if f["type"] == "token")


def _chat_json(rid: str, fields: dict[str, str]) -> str:
    """A chat frame with sampling fields written as raw JSON (1e400, 5e-324 ... as typed)."""
    extra = "".join(f', "{k}": {v}' for k, v in fields.items())
    return (f'{{"type": "chat", "id": "{rid}", "max_tokens": 3, "messages": '
            f'[{{"role": "user", "content": "Hi"}}]{extra}}}')  # fmt: skip


# as typed in JSON: in-range and boundary values, denormals, infinities (1e400), negatives,
# huge integers; most are allowed, so that most combinations reach the engine
TEMPERATURES = ["0", "-0.0", "5e-324", "1e-320", "1e-45", "1e-38", "1e-6", "9.99e-6", "1e-5",
                "0.5", "1", "2", "100", "1e400", "-1", "100.5"]  # fmt: skip
PROBABILITIES = ["5e-324", "1e-320", "1e-45", "1e-38", "1e-6", "0.05", "0.5", "0.95", "1", "0",
                 "1.0000001", "-5e-324"]  # fmt: skip
PENALTIES = ["0.01", "0.5", "1", "1.1", "2", "10", "0.00999", "5e-324", "1e400"]
TOP_KS = ["0", "1", "2", "40", "262144", "2147483647", "2147483648", "1" + "0" * 40, "-1", "1.5"]
SEEDS = ["0", "1", "4294967295", "4294967296", "-1", "18446744073709551616"]


class TestSamplingFuzz:
    """Sampling values fuzzed against the real engine, beside one long run of bob's replies."""

    @pytest.fixture(scope="class")
    def pair(self, live):
        streamer, ws = Streamer(live), WS(live.url)
        ws.hello("alice")
        replies: list[dict] = []
        yield ws, streamer, replies
        ws.close()
        assert len(streamer.finish()) >= 2
        assert len(replies) >= 10, "too few examples reached the engine"
        live.wait_idle()

    @settings(max_examples=80, deadline=None)
    @given(
        st.fixed_dictionaries(
            {},
            optional={
                "temperature": st.sampled_from(TEMPERATURES),
                "top_p": st.sampled_from(PROBABILITIES),
                "min_p": st.sampled_from(PROBABILITIES),
                "repeat_penalty": st.sampled_from(PENALTIES),
                "top_k": st.sampled_from(TOP_KS),
                "seed": st.sampled_from(SEEDS),
            },
        )
    )
    def test_every_value_is_refused_at_the_door_or_safe(self, pair, fields):
        ws, streamer, replies = pair
        ws.send(_chat_json("f", fields))
        first = ws.recv(60)
        if first["type"] == "error":
            assert first["code"] == "bad_request" and first["id"] == "f", (fields, first)
            return
        frames = ws.until_done("f", timeout=120)
        assert frames[-1]["finish_reason"] in ("stop", "length"), (fields, frames[-1])
        assert not [f for f in frames if f["type"] == "error"], fields
        assert not streamer.problems
        replies.append(frames[-1])


def test_a_sampling_fault_fails_only_its_own_request(live, connect, bob):
    """NaN logits (a model fault confined to one sequence) end that request alone."""
    from localserve.sampling import Sampler

    real = Sampler.sample

    def poisoned(self, logits):
        if self.params.seed == 4242:
            logits[:] = float("nan")
        return real(self, logits)

    Sampler.sample = poisoned
    try:
        alice = connect()
        alice.hello("alice")
        alice.chat("bad", QUESTION, max_tokens=8, seed=4242, temperature=0.7)
        frames = alice.until_done("bad")
    finally:
        Sampler.sample = real
    errors = [f for f in frames if f["type"] == "error"]
    assert errors and errors[0]["code"] == "internal" and errors[0]["id"] == "bad"
    assert "not finite" in errors[0]["message"]
    assert frames[-1]["finish_reason"] == "error"
    alice.chat("good", QUESTION, max_tokens=4)  # the same connection goes on
    assert alice.until_done("good")[-1]["finish_reason"] in ("stop", "length")


# --- 2. buffers bounded in bytes; before hello only a few errors ---------------------------


def test_error_frames_quote_at_most_a_little_of_the_input(live, connect, bob):
    ws = connect()
    ws.hello("mallory")
    huge = "k" * (live.config.max_frame_bytes - 100)
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


def test_before_hello_a_connection_gets_three_errors_then_is_closed(live, connect, bob):
    ws = connect()
    for _ in range(3):
        ws.send("{not json")
        assert ws.recv()["code"] == "bad_request"
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(5)
    assert closed.value.rcvd.code == 1008


def test_non_reading_connections_provoking_errors_stay_within_the_memory_bound(live, bob):
    """Four connections send frames that each earn an error, and never read a byte.

    First 10 frames of 60 KB each (whose errors used to quote them whole; the server reads a
    client at most max_frame_bytes + 64 KiB a second), then small frames until the server has
    had enough: it must close them, and its memory must stay bounded.
    """
    config, n_conns = live.config, 4
    per_conn = ((MAX_QUEUED_FRAMES + 1) * (config.max_frame_bytes + FRAME_SLACK_BYTES)
                + config.max_outbox_bytes + (64 << 10))  # fmt: skip
    big = json.dumps({"type": "chat", "id": "x", "k" * 60_000: 1})
    small = json.dumps({"type": "cancel", "id": "n" * 128})
    before = rss_bytes()
    peak = [before]
    clients = [RawClient(live.url) for _ in range(n_conns)]
    for i, client in enumerate(clients):
        client.send({"type": "hello", "user": f"reader{i}"})
    sent = [0] * n_conns

    def attack(i: int) -> None:
        while sent[i] < 100_000 and clients[i].send(big if sent[i] < 10 else small):
            sent[i] += 1

    threads = [threading.Thread(target=attack, args=(i,)) for i in range(n_conns)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak.append(rss_bytes())
        time.sleep(0.02)
    for client in clients:
        client.close()
    growth = max(peak) - before
    # the bound, plus room for the interpreter's own churn; echoing each big frame back, as
    # the server used to, pinned 60 KB per unread error
    assert growth < n_conns * per_conn + (48 << 20), (growth, sent)
    assert all(n < 100_000 for n in sent), "the server should have closed them"
    wait_for(lambda: not _connections_of(live, "reader"), 10, "readers dropped")


def _connections_of(live, prefix: str) -> list:
    """The server's connections whose user name starts with `prefix` (read on its loop)."""

    async def find():
        return [c for c in live.server.connections if (c.user or "").startswith(prefix)]

    return live.call(find())


# --- 3. a reader that stops reading is dropped, its cells back in the pool -----------------


def test_a_non_reading_chatter_is_dropped_and_its_cells_freed(live, bob):
    """Eight long replies asked for and never read: no pong comes back, so it is closed."""
    before = live.snapshot().counters.cancellations
    with configured(live, keepalive_s=1.0):
        client = RawClient(live.url)
        client.send({"type": "hello", "user": "sponge"})
        messages = [{"role": "user", "content": "Write a long story."}]
        for i in range(8):
            client.send({"type": "chat", "id": f"c{i}", "max_tokens": 1500, "ignore_eos": True,
                         "messages": messages})  # fmt: skip
        wait_for(lambda: _connections_of(live, "sponge"), 10, "sponge connected")
        took = wait_for(lambda: not _connections_of(live, "sponge"), 30, "sponge dropped")
        client.close()
    assert took < 2 * 1.0 + CLOSE_TIMEOUT_S + 2, took  # eight replies of 1,500 tokens: minutes
    cancelled = lambda: live.snapshot().counters.cancellations - before == 8  # noqa: E731
    wait_for(cancelled, 10, "its eight requests cancelled")
    assert not [s for s in live.snapshot().seqs if s.user == "sponge"]  # cells back in the pool


def test_a_socket_that_does_not_drain_is_closed_with_1008(live, bob):
    """Stats every 50 ms to a client that reads nothing: the socket fills, the write waits."""
    with configured(live, write_timeout_s=1.0, keepalive_s=600):
        client = RawClient(live.url)
        client.send({"type": "hello", "user": "clog"})
        client.send({"type": "subscribe", "interval_ms": 50})
        wait_for(lambda: _connections_of(live, "clog"), 10, "clog connected")
        took = wait_for(lambda: not _connections_of(live, "clog"), 60, "clog dropped")
        client.close()
    assert took < 30, took


def test_a_client_that_never_answers_pings_is_closed_with_1008(live, bob):
    with configured(live, keepalive_s=0.5):
        client = RawClient(live.url)
        client.send({"type": "hello", "user": "deaf"})
        wait_for(lambda: _connections_of(live, "deaf"), 10, "deaf connected")
        wait_for(lambda: not _connections_of(live, "deaf"), 2 + 2 * CLOSE_TIMEOUT_S, "dropped")
        client.close()


# --- 4. no input ends a connection with 1011 ------------------------------------------------


def test_inputs_that_used_to_end_in_1011_get_error_frames(live, connect, bob):
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


def test_non_ascii_tokens_are_compared_as_bytes(live, connect, bob):
    access = Access({"zoë": "grüße-für-zoë", "kate": "correct-horse"}, monitor_token="mönitor-ß")
    with configured(live, access=access):
        ws = connect()
        assert ws.hello("kate", "cörrect-hörse")["code"] == "unauthorized"  # not a TypeError
        assert ws.hello("zoë", "grüße-für-zoë")["type"] == "welcome"
        ws.send({"type": "subscribe", "interval_ms": 0, "token": "mönitor-x"})
        assert ws.recv()["code"] == "unauthorized"
        ws.send({"type": "subscribe", "interval_ms": 100, "token": "mönitor-ß"})
        assert ws.recv()["type"] == "stats"
        ws.send({"type": "subscribe", "interval_ms": 0})


def test_a_failure_while_handling_a_frame_is_an_internal_error(live, connect, bob):
    server = live.server
    real = server.submit

    async def broken(*args):
        raise RuntimeError("boom")

    ws = connect()
    ws.hello("ivy")
    server.submit = broken
    try:
        ws.chat("x", QUESTION)
        reply = ws.recv()
    finally:
        server.submit = real
    assert reply["type"] == "error" and reply["code"] == "internal"
    ws.chat("y", QUESTION, max_tokens=2)  # the connection lives on
    assert ws.until_done("y")[-1]["finish_reason"] in ("stop", "length")


# --- 5. token guessing is throttled per address ---------------------------------------------


def test_failed_authentication_is_throttled_per_address_and_user(live, connect, bob):
    access = Access({"kate": "correct-horse", "liz": "battery-staple"}, monitor_token="m-secret")
    with configured(live, access=access, max_auth_failures_per_minute=5) as server:
        for i in range(5):  # fresh sockets each time: the per-socket limit does not help
            assert connect().hello("kate", f"guess-{i}")["code"] == "unauthorized"
        reply = connect().hello("kate", "correct-horse")  # right, but refused all the same
        assert reply["code"] == "unauthorized" and "try again in" in reply["message"]
        assert connect().hello("liz", "battery-staple")["type"] == "welcome"  # others sign in
        metrics = live.http + "/metrics"
        good = urllib.request.Request(metrics, headers={"Authorization": "Bearer m-secret"})
        assert urllib.request.urlopen(good, timeout=10).status == 200
        for i in range(5):
            wrong = urllib.request.Request(metrics, headers={"Authorization": f"Bearer m{i}"})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(wrong, timeout=10)
            assert refused.value.code == 401
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(good, timeout=10)
        assert refused.value.code == 429 and int(refused.value.headers["Retry-After"]) > 0
        assert server.throttle.num_failures == 10 and server.throttle.num_throttled == 2
        server.throttle.clock = lambda: time.monotonic() + 61  # a minute later
        assert connect().hello("kate", "correct-horse")["type"] == "welcome"
        text = urllib.request.urlopen(good, timeout=10).read().decode()
        assert 'localserve:auth_failures_total{model_name="gemma-3-270m"} 10' in text
        assert 'localserve:auth_throttled_total{model_name="gemma-3-270m"} 2' in text


def test_guessing_from_other_loopback_addresses_counts_as_one_place(live, bob):
    with configured(live, access=Access({"kate": "correct-horse"}),
                    max_auth_failures_per_minute=3) as server:  # fmt: skip

        def hello(source: str, token: str) -> dict:
            client = RawClient(live.url, source=source)
            client.send({"type": "hello", "user": "kate", "token": token})
            reply = client.recv()
            client.close()
            return reply

        for i in range(3):
            assert hello(f"127.0.0.{i + 2}", f"guess-{i}")["code"] == "unauthorized"
        assert "try again in" in hello("127.0.0.9", "correct-horse")["message"]
        assert server.throttle.num_failures == 3


def test_metrics_follow_the_stats_rule(live, bob):
    with configured(live, access=Access({"kate": "correct-horse"}, monitor_token="m-secret")):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "m-secret"}):
            request = urllib.request.Request(live.http + "/metrics", headers=headers)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            assert refused.value.code == 401
            assert refused.value.headers["WWW-Authenticate"].startswith("Bearer")
        request = urllib.request.Request(
            live.http + "/metrics", headers={"Authorization": "Bearer m-secret"}
        )
        assert b"localserve:engine_steps_total" in urllib.request.urlopen(request).read()
    assert b"engine_steps_total" in urllib.request.urlopen(live.http + "/metrics").read()


# --- 6. the smaller items ------------------------------------------------------------------


def test_sixteen_user_stop_strings_are_accepted_by_a_transcript_model(connect, bob):
    ws = connect()
    ws.hello("sam")
    ws.chat("s", QUESTION, max_tokens=4, stop=[f"zz{i}" for i in range(16)])
    assert ws.until_done("s")[-1]["finish_reason"] in ("stop", "length")
    ws.chat("t", QUESTION, max_tokens=4, stop=[f"zz{i}" for i in range(17)])
    reply = ws.recv()
    assert reply["code"] == "bad_request" and "stop" in reply["message"]
    ws.chat("u", QUESTION, max_tokens=4, stop=["z" * 257])
    assert ws.recv()["code"] == "bad_request"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS", "PATCH"])
def test_every_http_method_but_get_is_405(live, method):
    for path, body in (("/healthz", None), ("/metrics", b"x=1"), ("/", b'{"a": 1}')):
        request = urllib.request.Request(live.http + path, data=body, method=method)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 405 and "GET" in refused.value.headers["Allow"]
    assert urllib.request.urlopen(live.http + "/healthz", timeout=10).status == 200


# --- found by review: pings, squatters, sampling cost, tokenizing, caches -------------------


def test_a_client_that_pings_and_never_reads_is_cut_off(live, bob):
    """websockets answers every ping at once: unread pongs must not pile up in the server."""
    before = rss_bytes()
    client = RawClient(live.url)
    client.send({"type": "hello", "user": "pinger"})
    sent = 0
    while sent < 200_000 and client.send("x" * 125, opcode=0x9):
        sent += 1
    client.close()
    assert sent < 200_000, "the server should have cut it off"
    assert rss_bytes() - before < 32 << 20
    wait_for(lambda: not _connections_of(live, "pinger"), 10, "pinger dropped")


def test_a_connection_must_say_hello_or_subscribe_soon(live, monkeypatch, bob):
    import localserve.connection

    monkeypatch.setattr(localserve.connection, "HELLO_TIMEOUT_S", 0.5)
    silent, monitor = WS(live.url), WS(live.url)
    monitor.send({"type": "subscribe", "interval_ms": 200})
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            silent.recv(5)
    assert closed.value.rcvd.code == 1008 and "hello" in closed.value.rcvd.reason
    assert monitor.recv()["type"] == "stats" and monitor.recv()["type"] == "stats"
    monitor.close()


def test_health_and_metrics_answer_when_the_connections_are_all_taken(live, connect, bob):
    with configured(live, max_connections=1):  # bob holds it
        assert urllib.request.urlopen(live.http + "/healthz", timeout=10).status == 200
        assert urllib.request.urlopen(live.http + "/metrics", timeout=10).status == 200
        with pytest.raises(Exception, match="503"):
            connect()


def test_a_far_too_long_prompt_is_refused_before_all_of_it_is_tokenized(live, connect, bob):
    ws = connect()
    ws.hello("paste")
    ws.chat("p", "word " * 12_000)  # 60,000 characters; the context holds 4,096 tokens
    reply = ws.recv()
    assert reply["code"] == "too_long" and "over" in reply["message"] and "4096" in reply["message"]


def test_long_system_prompts_do_not_fill_the_token_cache(live, connect, bob):
    cache = live.server.prompts._system_tokens
    before = cache.cache_info().currsize
    ws = connect()
    ws.hello("sys")
    for i in range(2):  # each system prompt is over the cached size (yet only ~560 tokens)
        system = f"{i}" + " " * 17_000
        ws.send({"type": "chat", "id": f"s{i}", "max_tokens": 1,
                 "messages": [{"role": "system", "content": system},
                              {"role": "user", "content": "hi"}]})  # fmt: skip
        ws.until_done(f"s{i}")
    assert cache.cache_info().currsize == before


def test_a_client_is_read_at_most_so_fast(live, bob):
    """Frames are read at max_frame_bytes + 64 KiB a second, each charged at least 1 KiB."""
    rate = live.config.max_frame_bytes + FRAME_SLACK_BYTES
    # each is read and decoded, and earns no answer (no token is needed here)
    frame = json.dumps({"type": "subscribe", "interval_ms": 0, "token": "n" * 100})
    client = RawClient(live.url, sndbuf=16 << 10)
    client.send({"type": "hello", "user": "hasty"})
    start, sent = time.monotonic(), 0
    while sent < 1500 and client.send(frame):
        sent += 1
    took = time.monotonic() - start
    client.close()
    # ahead of the reading: the burst (2 x rate) and the kernel's buffers (~100 KB, ~700 frames)
    assert took > (1500 * FRAME_COST_BYTES - 2 * rate - 700 * FRAME_COST_BYTES) / rate / 2, took


# --- found by review of the HTTP stack (issue 11) ---------------------------------------------


def test_a_socket_that_stops_reading_and_closes_does_not_outlive_it(live, bob):
    """Stats it never reads, then a close frame: the kernel still holds unsent data for it, so
    a plain close would wait forever; the socket must go within the user timeout."""
    with configured(live, write_timeout_s=1.0, keepalive_s=600):
        baseline = live.server.limits.num_sockets
        client = RawClient(live.url)
        client.send({"type": "hello", "user": "zombie"})
        client.send({"type": "subscribe", "interval_ms": 50})
        wait_for(lambda: live.server.limits.num_sockets > baseline, 10, "zombie counted")
        time.sleep(3)  # its buffers fill
        client.send("", opcode=0x8)  # a close frame, and still nothing read
        took = wait_for(lambda: live.server.limits.num_sockets <= baseline, 60, "socket gone")
        client.sock.close()
    assert took < 30, took


def test_pipelined_requests_are_answered_whole_and_cancelled_with_their_connection(
    live, monkeypatch
):
    import localserve.transport

    monkeypatch.setattr(localserve.transport, "HEAD_TIMEOUT_S", 0.5)  # shorter than each reply
    url = live.http.removeprefix("http://")
    host, port = url.split(":")

    def request(n: int) -> bytes:
        messages = [{"role": "user", "content": QUESTION}]
        fields = {"max_tokens": n, "ignore_eos": True, "user": "piper"}
        body = json.dumps({"messages": messages} | fields).encode()
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
        return head % len(body) + body

    sock = socket.create_connection((host, int(port)))
    sock.settimeout(60)
    sock.sendall(request(40) + request(40))
    data = b""
    while data.count(b'"finish_reason":"length"') < 2:
        chunk = sock.recv(65536)
        assert chunk, data[-300:]
        data += chunk
    sock.close()
    before = live.snapshot().counters.cancellations
    sock = socket.create_connection((host, int(port)))
    sock.sendall(request(2000) + request(2000))  # the first runs, the second waits its turn
    wait_for(lambda: any(s.user == "piper" for s in live.snapshot().seqs), 20, "piper runs")
    sock.close()
    wait_for(lambda: live.snapshot().counters.cancellations > before, 10, "cancelled")
    live.wait_idle()


def test_one_place_cannot_take_every_socket(live, bob):
    with configured(live, max_connections=2):  # one place: max_connections + 32 sockets
        host, port = live.http.removeprefix("http://").split(":")
        idle = []
        for _ in range(2 + 40):
            idle.append(socket.create_connection((host, int(port))))
        time.sleep(0.5)
        refused = sum(map(_was_cut, idle))
        for sock in idle:
            sock.close()
    assert refused >= 8, refused  # bob's websocket holds one of the 34
    wait_for(lambda: urllib.request.urlopen(live.http + "/healthz", timeout=5).status == 200,
             15, "healthz answers again")  # fmt: skip


def _was_cut(sock: socket.socket) -> bool:
    """The server closed or reset this socket (an open idle one just times out)."""
    sock.settimeout(0.2)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
