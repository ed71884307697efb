"""One websocket connection (localserve/connection.py) on a server over the FakeRunner: frames in,
errors out, limits, access, and clients that stop reading. Nothing here needs the model's text;
the real-model paths are in test_server.py and test_hostile.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from helpers import FakeServer

from localserve.connection import MAX_OUTBOX_FRAMES
from localserve.transport import CLOSE_NOT_READING


@pytest.fixture(scope="module")
def fake():
    server = FakeServer()
    yield server
    server.close()


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
        await asyncio.wait_for(server.server.asgi(scope, receive, send), timeout)
        return sent

    return server.call(session(), timeout=timeout + 5)


def test_a_reader_that_stops_reading_is_closed_at_the_byte_limit_and_its_requests_cancelled():
    """Sixteen long replies, none read: their text is coalesced (one frame per request, so the
    frame limit is never reached) until the bytes waiting pass max_outbox_bytes."""
    server = FakeServer(
        step_s=0, n_ctx=16 * 4200, n_seq_max=16, max_inflight_per_user=16, write_timeout_s=600
    )
    try:
        long = {"max_tokens": 4096, "ignore_eos": True}
        chats = [chat(f"c{i}", f"story {i}", **long) for i in range(16)]
        sent = never_reading_client(server, [{"type": "hello", "user": "sponge"}, *chats])
        kinds = [m["type"] for m in sent]
        assert kinds == ["websocket.accept", "websocket.send", "websocket.close"]
        assert json.loads(sent[1]["text"])["type"] == "welcome"  # the write that never ended
        close = sent[2]
        limit = server.config.max_outbox_bytes
        assert close["code"] == CLOSE_NOT_READING
        assert close["reason"] == f"not reading: over {limit} bytes unsent"
        snap = server.wait_idle()  # those still running were cancelled, their cells freed
        assert snap.counters.finished == 16 and snap.counters.cancellations > 0
        assert snap.counters.generation_tokens < 16 * 4096 and not server.server.requests
        assert not server.server.connections
    finally:
        server.close()


def test_a_reader_that_stops_reading_is_closed_at_the_frame_limit(fake):
    n = MAX_OUTBOX_FRAMES + 10  # each earns an error frame (not coalesced)
    frames = [{"type": "hello", "user": "deaf"}]
    frames += [{"type": "cancel", "id": f"n{i}"} for i in range(n)]
    sent = never_reading_client(fake, frames)
    close = sent[-1]
    assert close["type"] == "websocket.close" and close["code"] == CLOSE_NOT_READING
    assert close["reason"] == f"not reading: over {MAX_OUTBOX_FRAMES} frames unsent"
    assert not fake.connections_of("deaf")
