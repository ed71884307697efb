"""One hostile user against a real server while another streams: nobody else may notice.

Every test here runs a second user, bob, who streams complete replies (fixed length, greedy)
the whole time the hostile input is sent; each of bob's replies must arrive whole. The server is
the real one on a loopback port with the real model (the `live` fixture), but where nothing
needs the model (memory bounds of unread errors and pongs): there the stand-in serves. Hostile
input that needs no model (bad frames, tokens, throttling, hello timeouts, HTTP methods) is
tried the same way, with bob, on the FakeRunner in test_websocket_connection.py; so are a
socket whose writes wait past write_timeout_s and an outbox past max_outbox_bytes, which need
text faster than a model's to fill a socket before the kernel's user timeout cuts it (here: a
socket that never drains).
"""

from __future__ import annotations

import json
import threading
import time

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localserve.bench.blocking_ws import WS
from localserve.bench.fake_server import connections_of
from localserve.bench.hostile import RawClient
from localserve.serve.server import FRAME_SLACK_BYTES
from localserve.serve.transport import FRAME_COST_BYTES
from tests.support.clients import Streamer
from tests.support.live import configured
from tests.support.waiting import wait_until

# a connection is read at max_frame_bytes + 64 KiB a second (each frame at least 1 KiB): the
# floods whose bound these tests show are read faster, or the wait is all they measure (the rate
# has its own test); a frame's size limit is set when the server starts, and stays
QUICK_READ_BYTES = 4 << 20
MAX_QUEUED_FRAMES = 1  # uvicorn's websocket protocol stops reading while a message waits


QUESTION = "What is the capital of France?"
BOB_TOKENS = 24


def streaming_bob(server):
    streamer = Streamer(server, BOB_TOKENS)
    yield streamer
    streamer.finish()
    server.wait_idle()


@pytest.fixture
def bob(live):
    yield from streaming_bob(live)


@pytest.fixture
def fake_bob(stand_in):
    """bob on the stand-in (the fake runner under the live model's name)."""
    yield from streaming_bob(stand_in)


def rss_bytes() -> int:
    """This process's resident memory (the live server runs in it)."""
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


# --- 1. one request's sampling cannot fail anyone else's step ------------------------------


@pytest.mark.model
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
    return (
        f'{{"type": "chat", "id": "{rid}", "max_tokens": 3, "messages": '
        f'[{{"role": "user", "content": "Hi"}}]{extra}}}'
    )


# as typed in JSON: in-range and boundary values, denormals, infinities (1e400), negatives,
# huge integers; most are allowed, so that most combinations reach the engine
TEMPERATURES = [
    "0",
    "-0.0",
    "5e-324",
    "1e-320",
    "1e-45",
    "1e-38",
    "1e-6",
    "9.99e-6",
    "1e-5",
    "0.5",
    "1",
    "2",
    "100",
    "1e400",
    "-1",
    "100.5",
]
PROBABILITIES = [
    "5e-324",
    "1e-320",
    "1e-45",
    "1e-38",
    "1e-6",
    "0.05",
    "0.5",
    "0.95",
    "1",
    "0",
    "1.0000001",
    "-5e-324",
]
PENALTIES = ["0.01", "0.5", "1", "1.1", "2", "10", "0.00999", "5e-324", "1e400"]
TOP_KS = ["0", "1", "2", "40", "262144", "2147483647", "2147483648", "1" + "0" * 40, "-1", "1.5"]
SEEDS = ["0", "1", "4294967295", "4294967296", "-1", "18446744073709551616"]


@pytest.mark.model
class TestSamplingFuzz:
    """Sampling values fuzzed against the real engine, beside one long run of bob's replies."""

    @pytest.fixture(scope="class")
    def pair(self, live):
        streamer, ws = Streamer(live, BOB_TOKENS), WS(live.url)
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


@pytest.fixture(scope="module")
def inproc():
    """The live configuration with the engine in this process, where a patch reaches it."""
    from localserve.serve.serving import serving
    from tests.support.live import LiveServer, live_config

    config = live_config()
    config.server = msgspec.structs.replace(config.server, engine_process=False)
    with serving(config, thread=True) as served:
        yield LiveServer(served)


@pytest.mark.model
def test_a_sampling_fault_fails_only_its_own_request(inproc):
    """NaN logits (a model fault confined to one sequence) end that request alone."""
    from localserve.bench.blocking_ws import WS
    from localserve.runners.sampling import Sampler

    bob = Streamer(inproc, BOB_TOKENS)
    real = Sampler.sample

    def poisoned(self, logits):
        if self.params.seed == 4242:
            logits[:] = float("nan")
        return real(self, logits)

    Sampler.sample = poisoned
    alice = WS(inproc.url)
    try:
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
    alice.close()
    bob.finish()
    inproc.wait_idle()


# --- 2. buffers bounded in bytes; before hello only a few errors ---------------------------


def test_non_reading_connections_provoking_errors_stay_within_the_memory_bound(stand_in, fake_bob):
    """Four connections send frames that each earn an error, and never read a byte.

    First 10 frames of 60 KB each (whose errors used to quote them whole; the server reads a
    client at most max_frame_bytes + 64 KiB a second), then small frames until the server has
    had enough: it must close them, and its memory must stay bounded. (Nothing here needs the
    model: on the stand-in, bob streaming beside.)
    """
    live = stand_in
    config, n_conns = live.config, 4
    per_conn = (
        (MAX_QUEUED_FRAMES + 1) * (config.max_frame_bytes + FRAME_SLACK_BYTES)
        + config.max_outbox_bytes
        + (64 << 10)
    )
    big = json.dumps({"type": "chat", "id": "x", "k" * 60_000: 1})
    small = json.dumps({"type": "cancel", "id": "n" * 128})
    before = rss_bytes()
    peak = [before]
    with configured(live, max_frame_bytes=QUICK_READ_BYTES):  # read at its rate from its start
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
    wait_until(lambda: not connections_of(live, "reader"), 30, "readers dropped")


# --- 3. a reader that stops reading is dropped, its cells back in the pool -----------------


@pytest.mark.model
def test_a_non_reading_chatter_is_dropped_and_its_cells_freed(live, bob):
    """Eight long replies asked for and never read: no pong comes back, so it is closed."""
    before = live.snapshot().counters.cancellations
    with configured(live, keepalive_s=1.0):
        client = RawClient(live.url)
        client.send({"type": "hello", "user": "sponge"})
        messages = [{"role": "user", "content": "Write a long story."}]
        for i in range(8):
            client.send(
                {
                    "type": "chat",
                    "id": f"c{i}",
                    "max_tokens": 1500,
                    "ignore_eos": True,
                    "messages": messages,
                }
            )
        wait_until(lambda: connections_of(live, "sponge"), 30, "sponge connected")
        # for the missing pong (the close frame says so), not the end of eight replies of 1,500
        # tokens; the bound only a safety net (the ping timeout and close timeout: seconds)
        wait_until(lambda: not connections_of(live, "sponge"), 60, "sponge dropped")
        assert client.close_frame() == (1008, "no pong within 1 s")  # read once it is closed
        client.close()
    cancelled = lambda: live.snapshot().counters.cancellations - before == 8  # noqa: E731
    wait_until(cancelled, 30, "its eight requests cancelled")
    assert not [s for s in live.snapshot().seqs if s.user == "sponge"]  # cells back in the pool


@pytest.mark.model
def test_a_client_that_never_answers_pings_is_closed_with_1008(live, bob):
    with configured(live, keepalive_s=0.5):
        client = RawClient(live.url)
        client.send({"type": "hello", "user": "deaf"})
        wait_until(lambda: connections_of(live, "deaf"), 30, "deaf connected")
        wait_until(lambda: not connections_of(live, "deaf"), 60, "dropped")  # for the pong
        assert client.close_frame() == (1008, "no pong within 0.5 s")
        client.close()


# --- 4. no input ends a connection with 1011 ------------------------------------------------


# --- 5. token guessing is throttled per address ---------------------------------------------


# --- 6. the smaller items ------------------------------------------------------------------


@pytest.mark.model
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


# --- found by review: pings, squatters, sampling cost, tokenizing, caches -------------------


def test_a_client_that_pings_and_never_reads_is_cut_off(stand_in, fake_bob):
    """websockets answers every ping at once: unread pongs must not pile up in the server (on
    the stand-in, bob streaming beside: nothing here needs the model)."""
    live = stand_in
    before = rss_bytes()
    with configured(live, max_frame_bytes=QUICK_READ_BYTES):  # read at its rate from its start
        client = RawClient(live.url)
    client.send({"type": "hello", "user": "pinger"})
    sent = 0
    while sent < 200_000 and client.send("x" * 125, opcode=0x9):
        sent += 1
    client.close()
    assert sent < 200_000, "the server should have cut it off"
    assert rss_bytes() - before < 32 << 20
    wait_until(lambda: not connections_of(live, "pinger"), 30, "pinger dropped")


@pytest.mark.model
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


@pytest.mark.model
def test_a_socket_that_stops_reading_and_closes_does_not_outlive_it(live, bob):
    """Stats it never reads, then a close frame: the kernel still holds unsent data for it, so
    a plain close would wait forever; the socket must go within the user timeout."""
    with configured(live, write_timeout_s=1.0, keepalive_s=600):
        baseline = live.server.limits.num_sockets
        client = RawClient(live.url)
        client.send({"type": "hello", "user": "zombie"})
        client.send({"type": "subscribe", "interval_ms": 50})
        wait_until(lambda: live.server.limits.num_sockets > baseline, 30, "zombie counted")
        time.sleep(3)  # its buffers fill
        client.send("", opcode=0x8)  # a close frame, and still nothing read
        wait_until(lambda: live.server.limits.num_sockets <= baseline, 30, "socket gone")
        client.sock.close()


# --- the Ollama API (issue 29) ----------------------------------------------------------------


@pytest.mark.model
def test_hostile_ollama_bodies_and_a_dropped_stream_fail_only_themselves(live, bob):
    """Wrong option types, huge and deep bodies, broken JSON and a stream dropped mid-reply on
    /api: each a clear error (or cancelled), bob's replies whole."""
    import http.client
    import socket
    import urllib.parse

    url = urllib.parse.urlsplit(live.http)
    ask = [{"role": "user", "content": QUESTION}]
    hostile = [
        json.dumps({"messages": ask, "options": {"temperature": "hot"}}).encode(),
        json.dumps({"messages": ask, "options": {"num_predict": 10**12}}).encode(),
        json.dumps({"messages": ask, "format": {"type": "object", "uniqueItems": True}}).encode(),
        b'{"messages": ' + b"[" * 20000 + b"]" * 20000 + b"}",
        b'{"messages": [' + b"x" * (live.config.max_frame_bytes + 1) + b"]}",
        b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
    ]
    for _ in range(3):
        for body in hostile:
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
            conn.request("POST", "/api/chat", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            payload = response.read()
            conn.close()
            assert response.status in (400, 413), (response.status, payload[:200])
            assert set(json.loads(payload)) == {"error"}
        sock = socket.create_connection((url.hostname, url.port))
        body = json.dumps({"messages": ask, "options": {"num_predict": 500}}).encode()
        head = b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
        sock.sendall(head % len(body) + body)
        sock.recv(100)  # its stream started
        sock.close()
    assert len(bob.finish()) >= 1


# --- the Anthropic Messages API (issue 29) ----------------------------------------------------


@pytest.mark.model
def test_hostile_anthropic_bodies_and_a_dropped_stream_fail_only_themselves(live, bob):
    """Malformed bodies, wrong types, huge block lists, deep nesting and a stream dropped
    mid-reply on /v1/messages: each a clear 4xx in Anthropic's shape (or cancelled), bob's
    replies whole."""
    import socket
    import urllib.parse

    from localserve.serve.anthropic.messages import MAX_BLOCKS

    url = urllib.parse.urlsplit(live.http)
    base = {"model": "gemma-3-270m", "max_tokens": 5}
    ask = [{"role": "user", "content": QUESTION}]
    many = [{"type": "text", "text": "x"}] * (MAX_BLOCKS + 1)
    limit = 256 << 10  # the default max_frame_bytes: a body the block count alone refuses
    assert len(json.dumps(many, separators=(",", ":"))) < limit
    result = {"type": "tool_result", "tool_use_id": "t", "content": many}
    hostile = [
        (base | {"messages": ask, "max_tokens": "many"}, "max_tokens"),
        (base | {"messages": ask, "temperature": "hot"}, "temperature"),
        (base | {"messages": ask, "temperature": -3}, "temperature"),
        (base | {"messages": ask, "stop_sequences": ["x"] * 100}, "stop_sequences"),
        (base | {"messages": ask, "tools": [{"name": "f"}]}, "input_schema"),
        (
            base | {"messages": ask, "tools": [{"type": "web_search_20250305", "name": "w"}]},
            "tools.0.type",
        ),  # fmt: skip
        (base | {"messages": ask, "tool_choice": {"type": "tool"}}, "tool_choice"),
        (base | {"messages": ask, "thinking": {"type": "maybe"}}, "thinking"),
        (base | {"messages": [{"role": "user", "content": many}]}, "content blocks"),
        (base | {"messages": [{"role": "user", "content": [result]}]}, "content blocks"),
        (base | {"messages": [{"role": "system", "content": "x"}]}, "role"),
        (base | {"messages": [{"role": "user", "content": [{"type": "document"}]}]}, "document"),
        (base | {"messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "type"),
        (base | {"messages": [{"role": "assistant", "content": "prefill"}]}, "prefill"),
        (base | {"messages": []}, "messages"),
        (base | {"messages": "hi"}, "messages"),
        ([1, 2], "object"),
    ]
    raw = [
        b'{"messages": ' + b"[" * 20000 + b"]" * 20000 + b"}",
        b'{"messages": [' + b"x" * (limit + 1) + b"]}",
        b'{"model": "gemma-3-270m", "max_tokens": 5, "messages": [{"role": "user", '
        b'"content": "\xff\xfe"}]}',
        b"{",
        b"",
    ]
    compact = [(json.dumps(b, separators=(",", ":")).encode(), words) for b, words in hostile]
    bodies = compact + [(b, "") for b in raw]
    for _ in range(2):
        with configured(live, max_frame_bytes=limit):
            refuse_all(url, bodies)
        sock = socket.create_connection((url.hostname, url.port))
        body = json.dumps(base | {"messages": ask, "max_tokens": 500, "stream": True}).encode()
        head = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
        sock.sendall(head % len(body) + body)
        sock.recv(100)  # its stream started
        sock.close()
    assert len(bob.finish()) >= 1


def refuse_all(url, bodies: list[tuple[bytes, str]]) -> None:
    """Each body to both endpoints: a 400 or 413 in Anthropic's shape whose message names
    `words`."""
    import http.client

    for body, words in bodies:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            payload = response.read()
            conn.close()
            if path.endswith("count_tokens") and words in ("max_tokens", "temperature",
                                                           "stop_sequences"):  # fmt: skip
                continue  # not count_tokens' fields: ignored there
            assert response.status in (400, 413), (path, body[:100], payload[:200])
            error = json.loads(payload)
            assert error["type"] == "error", payload[:200]
            assert words in error["error"]["message"], (words, payload[:300])


# --- CORS preflights (issue 29) -----------------------------------------------------------------


@pytest.mark.model
def test_hostile_preflights_get_a_clear_refusal_and_harm_nobody(live, bob):
    """Huge or garbled Access-Control-Request-Headers and odd methods from a listed origin: each
    a 400 naming the field or a refusal of the method, never a reflection of it; bob's replies
    whole."""
    import http.client
    import urllib.parse

    from localserve.serve.cors import MAX_REQUESTED_CHARS, MAX_REQUESTED_HEADERS

    url = urllib.parse.urlsplit(live.http)
    page = "http://127.0.0.1:1"

    def preflight(path: str, method: str, asked: str | None = "content-type"):
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        headers = {"Origin": page, "Access-Control-Request-Method": method}
        conn.request("OPTIONS", path, headers=headers | ({} if asked is None else {
            "Access-Control-Request-Headers": asked}))  # fmt: skip
        response = conn.getresponse()
        body = response.read()
        conn.close()
        return response.status, response.headers, body

    hostile_headers = [
        "x" * (MAX_REQUESTED_CHARS + 1),
        "a," * 30000,  # 60 KB
        ",".join(f"x-h{i}" for i in range(MAX_REQUESTED_HEADERS + 1)),
        "content-type, x y",
        "content-type;authorization",
        "(x)",
        ",,,",
        "content-type, \u00e9".encode().decode("latin-1"),
    ]
    odd_methods = ["TRACE", "CONNECT", "PROPFIND", "post", "GET", "M" * 10000, "OPTIONS"]
    with configured(live, allowed_origins=[page]):
        for _ in range(3):
            for asked in hostile_headers:
                status, headers, body = preflight("/v1/chat/completions", "POST", asked)
                assert status == 400 and b"Access-Control-Request-Headers" in body, asked[:40]
                assert "access-control-allow-headers" not in headers
            for method in odd_methods:
                status, headers, body = preflight("/v1/chat/completions", method)
                assert status == 400 and body == b"Disallowed CORS method", method[:40]
            status, headers, _ = preflight("/api/tags", "GET", None)
            assert status == 200 and headers["access-control-allow-methods"] == "GET, HEAD"


# --- a trusted front-end's person headers (issue 29) ------------------------------------------


@pytest.mark.model
def test_hostile_person_headers_fail_only_themselves(live, bob, tmp_path):
    """A trusted front-end's key with header floods, huge values, control characters and more
    people than its bound: each a 400 naming the header (or the transport's 400 for what HTTP
    forbids, or 403 past the bound), the registry bounded, bob's replies whole."""
    import http.client
    import urllib.parse

    from localserve.ops.auth import Access
    from localserve.ops.people import DATABASE, PeopleStore
    from localserve.serve.trusted_proxies import People

    url = urllib.parse.urlsplit(live.http)
    key = "owui-connection-key"

    def ask(headers: list[tuple[str, str | bytes]]) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        conn.putrequest("GET", "/v1/models")
        conn.putheader("Authorization", f"Bearer {key}")
        for name, value in headers:
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        payload = response.read()
        conn.close()
        return response.status, payload

    name = "X-OpenWebUI-User-Name"
    admission = live.server.admission
    store = PeopleStore(tmp_path / DATABASE)
    old_people, admission.people = admission.people, People(store)
    access = Access({"openwebui": key})
    limits = dict(trusted_frontends=["openwebui"], max_people_per_frontend=50)
    try:
        with configured(live, access=access, **limits):
            status, payload = ask([(name, f"p{i}") for i in range(1000)])  # ~20 KiB of head
            assert status == 400 and b"given 1000 times" in payload
            status, _ = ask([(name, "p") for _ in range(5000)])  # past the head's bound
            assert status in (400, 431)
            status, payload = ask([(name, "x" * 60_000)])
            assert status == 400 and b"longer than 1024" in payload
            for raw in (b"a\x00b", b"a\x01b", b"a\x7fb", b"a\x1b[31mred"):
                assert ask([(name, raw)])[0] == 400  # what HTTP forbids: the transport's 400
            for encoded in ("a%00b", "a%1B%5B31mred", "%E2%80%AE"):
                status, payload = ask([(name, encoded)])
                assert (
                    status == 400 and payload.startswith(b'{"error"') and name.encode() in payload
                )
            statuses = [ask([(name, f"person {i}")])[0] for i in range(120)]
            assert statuses[:50] == [200] * 50 and set(statuses[50:]) == {403}
            assert admission.people.num_people("openwebui") == 50
            assert ask([(name, "person 7")])[0] == 200  # a known one goes on
            assert len(store.bindings()) == 50  # the rows as bounded as the registry
    finally:
        admission.people = old_people
        store.close()
    assert len(bob.finish()) >= 1
