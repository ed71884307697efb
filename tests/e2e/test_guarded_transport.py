"""The guarded HTTP and websocket protocols (localserve/serve/transport.py) on a server over the
FakeRunner: pipelining, the caps on one place's sockets (their rule, on `ConnectionLimits` alone,
is in unit/serve/test_transport.py), a squatter that must not keep others out, malformed frames.
What a hostile client does to the real model's server is in test_hostile_clients.py.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import struct
import time
import urllib.request

import pytest

from localserve.bench.hostile import RawClient, Squatter, healthy_from
from localserve.serve.server import FRAME_SLACK_BYTES
from localserve.serve.transport import LOG_INTERVAL_S, MIN_IDLE_S, PlaceLog
from tests.support.clients import Streamer
from tests.support.live import configured
from tests.support.waiting import wait_until

QUESTION = "What is the capital of France?"


@pytest.fixture
def bob(fake):
    streamer = Streamer(fake)
    yield streamer
    streamer.finish()
    fake.wait_idle()


def test_pipelined_requests_are_answered_whole_and_cancelled_with_their_connection(
    fake, monkeypatch
):
    import localserve.serve.transport

    monkeypatch.setattr(
        localserve.serve.transport, "HEAD_TIMEOUT_S", 0.5
    )  # shorter than each reply
    monkeypatch.setattr(fake.runner, "step_s", 0.02)  # 40 tokens: 0.8 s
    url = fake.http.removeprefix("http://")
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
    before = fake.snapshot().counters.cancellations
    sock = socket.create_connection((host, int(port)))
    sock.sendall(request(2000) + request(2000))  # the first runs, the second waits its turn
    wait_until(lambda: any(s.user == "piper" for s in fake.snapshot().seqs), 60, "piper runs")
    sock.close()
    wait_until(lambda: fake.snapshot().counters.cancellations > before, 30, "cancelled")
    fake.wait_idle()


def test_one_place_cannot_take_every_socket(fake, bob):
    with configured(fake, max_connections=2):  # one place: 34 sockets, a burst up to 68
        host, port = fake.http.removeprefix("http://").split(":")
        idle = [socket.create_connection((host, int(port))) for _ in range(68 + 8)]
        cut: set[socket.socket] = set()

        def enough_cut() -> bool:
            readable, _, _ = select.select([s for s in idle if s not in cut], [], [], 0)
            cut.update(s for s in readable if _was_cut(s))
            return len(cut) >= 8  # bob's websocket holds one of the 68

        wait_until(enough_cut, 30, "the sockets over twice the cap cut")
        for sock in idle:
            sock.close()
    wait_until(
        lambda: urllib.request.urlopen(fake.http + "/healthz", timeout=30).status == 200,
        60,
        "healthz answers again",
    )


@pytest.mark.parametrize("kind", [*Squatter.KINDS, "mixed"])
def test_one_place_squatting_on_sockets_leaves_room_for_everyone_else(fake, kind):
    """100 sockets held by one local process (idle, half-open heads, silent websockets, or a
    third of each), each reopened as soon as the server closes it: another local user (another
    loopback address, the same place) still gets nearly every request through."""
    limits = fake.server.limits
    squatter = Squatter(fake.http, 100, kind)
    try:
        wait_until(lambda: squatter.num_open == 100, 30, "the squatter holds its sockets")
        time.sleep(MIN_IDLE_S)  # old enough to be closed for a newcomer
        evicted = limits.num_evicted
        health = sum(healthy_from(fake.http, "127.0.0.2", timeout=30) for _ in range(40))
        chats = sum(_hello_and_chat(fake.url, "127.0.0.2") for _ in range(40))
    finally:
        squatter.close()
    assert health >= 38 and chats >= 38, (health, chats, squatter.num_closed)
    assert limits.num_evicted > evicted  # room was made, not only a burst let in


def _hello_and_chat(url: str, source: str) -> bool:
    try:
        client = RawClient(url, source=source)
        client.sock.settimeout(30)
        client.send({"type": "hello", "user": "carol"})
        if client.recv()["type"] != "welcome":
            return False
        messages = [{"role": "user", "content": QUESTION}]
        client.send({"type": "chat", "id": "c", "max_tokens": 2, "messages": messages})
        while (frame := client.recv())["type"] != "done":
            pass
        client.close()
        return frame["finish_reason"] in ("stop", "length")
    except (OSError, AssertionError):  # cut, refused (a 503), or late
        return False


def _was_cut(sock: socket.socket) -> bool:
    """The server closed or reset this socket (an open idle one just times out)."""
    sock.settimeout(0.2)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


# --- malformed frames: the right close code, one line in the log ------------------------------

MASK = b"\0\0\0\0"  # a zero mask: the payload goes as it is


MALFORMED = [
    (b"\x81\x82" + MASK + b"\xff\xfe", 1007, "invalid UTF-8 at byte 0"),  # text, not UTF-8
    (b"\x81\x02hi", 1002, "incorrect masking"),  # a client's frame unmasked
    (b"\xc1\x82" + MASK + b"hi", 1002, "reserved bits must be 0"),  # compressed, not agreed
    (b"\x83\x82" + MASK + b"hi", 1002, "invalid opcode"),
    (
        b"\x88\x84" + MASK + b"\x03\xe8\xff\xfe",
        1007,
        "invalid start byte at position 0",
    ),  # close reason
]


@pytest.mark.parametrize(("data", "code", "reason"), MALFORMED)
def test_a_malformed_frame_closes_with_its_code_and_reason(fake, data, code, reason):
    client = RawClient(fake.url)
    client.send_raw(data)
    assert client.close_frame() == (code, reason)
    client.close()


def test_malformed_frames_are_one_line_in_the_log_not_a_traceback_each(fake, caplog):
    now = [0.0]
    limits = fake.server.limits
    real, limits.log = limits.log, PlaceLog(clock=lambda: now[0])
    try:
        with caplog.at_level(logging.INFO):
            for data, code, _ in MALFORMED * 4:
                client = RawClient(fake.url)
                client.send_raw(data)
                assert client.close_frame()[0] == code
                client.close()
            first = _warnings(caplog)
            now[0] += LOG_INTERVAL_S  # the next one after the interval says what was held back
            client = RawClient(fake.url)
            client.send_raw(MALFORMED[0][0])
            client.close_frame()
    finally:
        limits.log = real
    lines = _warnings(caplog)
    assert len(first) == 1 and len(lines) == 2, [r.getMessage() for r in lines]
    assert "malformed websocket frame (invalid UTF-8 at byte 0); closed, 1007" in lines[0]
    assert "(19 more like it from loopback in the last 10 s)" in lines[1]


def _warnings(caplog) -> list[str]:
    """The log's lines at WARNING and above; none may carry a traceback."""
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [r for r in records if r.exc_info or r.levelno >= logging.ERROR], records
    return [r.getMessage() for r in records]


# --- the frame limit and compression -----------------------------------------------------------


def test_a_frame_past_max_frame_bytes_plus_64_kib_closes_with_1009(fake):
    limit = fake.config.max_frame_bytes + FRAME_SLACK_BYTES
    client = RawClient(fake.url, sndbuf=1 << 20)
    client.send({"type": "hello", "user": "bulky"})
    assert client.recv()["type"] == "welcome"
    client.send("x" * limit)  # at the limit: read, and refused with an error frame
    reply = client.recv()
    assert reply["code"] == "bad_request" and "exceeds" in reply["message"]
    client.send_raw(struct.pack("!BBQ", 0x81, 0x80 | 127, limit + 1) + MASK)  # its head alone
    code, reason = client.close_frame()
    assert code == 1009 and f"exceeds limit of {limit} bytes" in reason
    client.close()


def test_permessage_deflate_is_not_offered_even_when_asked_for(fake):
    offer = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
    client = RawClient(fake.url, headers=offer)
    assert b"sec-websocket-extensions" not in client.head.lower(), client.head
    client.close()
