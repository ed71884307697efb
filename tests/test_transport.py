"""The guarded HTTP and websocket protocols (localserve/transport.py) on a server over the
FakeRunner: pipelining, and the cap on one place's sockets. What a hostile client does to the
real model's server is in test_hostile.py.
"""

from __future__ import annotations

import json
import select
import socket
import urllib.request

import pytest
from conftest import configured
from helpers import Streamer, wait_until

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
    import localserve.transport

    monkeypatch.setattr(localserve.transport, "HEAD_TIMEOUT_S", 0.5)  # shorter than each reply
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
    wait_until(lambda: any(s.user == "piper" for s in fake.snapshot().seqs), 20, "piper runs")
    sock.close()
    wait_until(lambda: fake.snapshot().counters.cancellations > before, 10, "cancelled")
    fake.wait_idle()


def test_one_place_cannot_take_every_socket(fake, bob):
    with configured(fake, max_connections=2):  # one place: max_connections + 32 sockets
        host, port = fake.http.removeprefix("http://").split(":")
        idle = []
        for _ in range(2 + 40):
            idle.append(socket.create_connection((host, int(port))))
        cut: set[socket.socket] = set()

        def enough_cut() -> bool:
            readable, _, _ = select.select([s for s in idle if s not in cut], [], [], 0)
            cut.update(s for s in readable if _was_cut(s))
            return len(cut) >= 8  # bob's websocket holds one of the 34

        wait_until(enough_cut, 10, "the sockets over the cap cut")
        for sock in idle:
            sock.close()
    wait_until(
        lambda: urllib.request.urlopen(fake.http + "/healthz", timeout=5).status == 200,
        15,
        "healthz answers again",
    )


def _was_cut(sock: socket.socket) -> bool:
    """The server closed or reset this socket (an open idle one just times out)."""
    sock.settimeout(0.2)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
