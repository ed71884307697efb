"""The server's outbox: what waits for a slow reader, counted in frames and bytes."""

from __future__ import annotations

import asyncio

import msgspec

from localserve.outbox import Outbox
from localserve.protocol import Error, Stats, TokenDelta


def drain(outbox: Outbox) -> list[dict]:
    async def take():
        return [msgspec.json.decode(await outbox.get()) for _ in range(len(outbox))]

    return asyncio.run(take())


def test_bytes_are_counted_as_encoded_and_back_to_zero_when_sent():
    outbox = Outbox()
    outbox.put(Error("bad_request", "x" * 100, "r1"))
    outbox.put_text("r1", "Hello")
    outbox.put_text("r1", ", wörld\n\x01")  # merged into the waiting frame, escapes counted
    encoded = [
        msgspec.json.encode(Error("bad_request", "x" * 100, "r1")),
        msgspec.json.encode(TokenDelta("r1", "Hello, wörld\n\x01")),
    ]
    assert len(outbox) == 2 and outbox.num_bytes == sum(map(len, encoded))
    frames = drain(outbox)
    assert frames[1] == {"type": "token", "id": "r1", "text": "Hello, wörld\n\x01"}
    assert outbox.num_bytes == 0 and outbox.is_empty


def test_only_the_newest_stats_frame_waits(fake_snapshots):
    outbox = Outbox()
    for snap in fake_snapshots[:5]:
        outbox.put_stats(msgspec.json.encode(Stats(snap)))
    newest = len(msgspec.json.encode(Stats(fake_snapshots[4])))
    assert len(outbox) == 1 and outbox.num_bytes == newest
    assert drain(outbox)[0]["snapshot"]["uptime_s"] == fake_snapshots[4].uptime_s
    assert outbox.num_bytes == 0
