"""The protocol client's `chat`: one chat's frames, against a scripted server and the real one."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from localserve.protocol.frames import Chat, Error, Finished, Message, Notice, Queued, TokenDelta
from localserve.websocket_client import Client, chat

LIMITS = {
    "max_frame_bytes": 1 << 20,
    "max_tokens": 4096,
    "max_inflight_per_user": 8,
    "max_queued_per_user": 16,
    "max_queued": 64,
}


def done(rid: str, reason: str = "stop") -> dict:
    usage = {"prompt_tokens": 5, "completion_tokens": 2, "cached_tokens": 0}
    timings = {"queue_ms": 0.1, "ttft_ms": 1.0, "itl_ms": 1.0, "e2e_ms": 2.0}
    return {"type": "done", "id": rid, "finish_reason": reason, "usage": usage, "timings": timings}


async def scripted(script, body):
    """Run `body(client)` against a server that answers each chat frame with `script(id)`'s
    frames; returns body's value and the frames the server received after hello (all of them:
    the client closes, and the server reads up to its close)."""
    from websockets.asyncio.server import serve

    received: list[dict] = []
    handled = asyncio.Event()

    async def handler(ws):
        try:
            await ws.recv()  # hello
            welcome = {
                "type": "welcome",
                "model": "fake",
                "n_ctx": 8192,
                "limits": LIMITS,
                "version": "0",
                "protocol": 1,
            }
            await ws.send(json.dumps(welcome))
            async for raw in ws:
                frame = json.loads(raw)
                received.append(frame)
                for answer in script(frame) if frame["type"] == "chat" else []:
                    await ws.send(json.dumps(answer))
        finally:
            handled.set()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with await Client.connect(f"ws://127.0.0.1:{port}", "u") as client:
            value = await body(client)
        await asyncio.wait_for(handled.wait(), 30)  # it read what was sent last, then the close
    return value, received


def request(rid: str = "r1", **kw) -> Chat:
    return Chat(id=rid, messages=[Message("user", "Hi")], **kw)


async def frames_of(client: Client, chat_request: Chat) -> list:
    return [frame async for frame in chat(client, chat_request)]


def test_yields_the_chats_frames_and_skips_other_requests():
    def script(frame):
        rid = frame["id"]
        return [
            {"type": "queued", "id": rid, "position": 1},
            {"type": "token", "id": "someone-else", "text": "x"},
            {"type": "token", "id": rid, "text": "Hel"},
            {"type": "notice", "code": "shutting_down", "message": "bye"},
            {"type": "token", "id": rid, "text": "lo"},
            done("someone-else"),
            done(rid),
            {"type": "token", "id": rid, "text": "never read"},
        ]

    frames, received = asyncio.run(scripted(script, lambda c: frames_of(c, request())))
    assert [type(f) for f in frames] == [Queued, TokenDelta, Notice, TokenDelta, Finished]
    assert "".join(f.text for f in frames if isinstance(f, TokenDelta)) == "Hello"
    assert frames[-1].id == "r1"
    assert [f["type"] for f in received] == ["chat"]  # a finished chat is not cancelled


def test_an_error_ends_the_chat_but_internal_waits_for_its_done():
    def refused(frame):
        return [{"type": "error", "code": "busy", "message": "later", "id": frame["id"]}]

    frames, received = asyncio.run(scripted(refused, lambda c: frames_of(c, request())))
    assert [(type(f), f.code) for f in frames] == [(Error, "busy")]
    assert [f["type"] for f in received] == ["chat"]

    def failed(frame):
        rid = frame["id"]
        return [
            {"type": "queued", "id": rid, "position": 1},
            {"type": "error", "code": "internal", "message": "decode", "id": rid},
            done(rid, "error"),
        ]

    frames, _ = asyncio.run(scripted(failed, lambda c: frames_of(c, request())))
    assert [type(f) for f in frames] == [Queued, Error, Finished]
    assert frames[-1].finish_reason == "error"


def test_an_error_without_an_id_ends_the_chat():
    def unreadable(frame):
        return [{"type": "error", "code": "bad_request", "message": "id: too long"}]

    frames, _ = asyncio.run(scripted(unreadable, lambda c: frames_of(c, request())))
    assert [(type(f), f.id) for f in frames] == [(Error, None)]


def test_stopping_early_cancels_the_request():
    def endless(frame):
        rid = frame["id"]
        return [{"type": "queued", "id": rid, "position": 1}] + [
            {"type": "token", "id": rid, "text": f"{i} "} for i in range(8)
        ]

    async def two_tokens(client):
        seen = []
        async with contextlib.aclosing(chat(client, request("long"))) as frames:
            async for frame in frames:
                seen.append(frame)
                if len(seen) == 3:
                    break
        return seen

    seen, received = asyncio.run(scripted(endless, two_tokens))
    assert [type(f) for f in seen] == [Queued, TokenDelta, TokenDelta]
    assert received[-1] == {"type": "cancel", "id": "long"}

    got_chat = asyncio.Event()

    def silent(frame):  # no done will come
        got_chat.set()
        return []

    async def cancelled_task(client):
        task = asyncio.create_task(frames_of(client, request("waits")))
        await asyncio.wait_for(got_chat.wait(), 30)  # the server has the chat
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    _, received = asyncio.run(scripted(silent, cancelled_task))
    assert [f["type"] for f in received] == ["chat", "cancel"]
    assert received[-1]["id"] == "waits"


@pytest.mark.model
def test_a_real_chat_and_a_cancelled_one(live):
    async def main():
        async with await Client.connect(live.url, "client-test") as client:
            one = await frames_of(client, request("a", max_tokens=8, temperature=0))
            refused = await frames_of(client, request("b", max_tokens=10**6))
            long = chat(client, request("c", max_tokens=2000, ignore_eos=True))
            async with contextlib.aclosing(long) as frames:
                async for frame in frames:
                    if isinstance(frame, TokenDelta):
                        break
            while not isinstance(frame := await client.recv(), Finished):
                pass
            return one, refused, frame

    one, refused, cancelled = asyncio.run(main())
    assert isinstance(one[0], Queued) and isinstance(one[-1], Finished)
    assert all(isinstance(f, TokenDelta) for f in one[1:-1]) and len(one) > 2
    assert one[-1].finish_reason in ("stop", "length") and one[-1].usage.completion_tokens <= 8
    assert [(type(f), f.code) for f in refused] == [(Error, "bad_request")]
    assert cancelled.id == "c" and cancelled.finish_reason == "cancelled"
    live.wait_idle()
