"""The server's outbox: what waits for a slow reader, counted in frames and bytes."""

from __future__ import annotations

import asyncio

import msgspec

from localserve.protocol.frames import Error, Stats, TokenDelta
from localserve.serve.websocket.outbox import Outbox


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


def test_token_text_is_coalesced_per_request_until_the_reader_takes_it():
    outbox = Outbox()
    outbox.put_text("a", "one ")
    outbox.put_text("b", "uno ")
    outbox.put(Error("busy", "later", "c"))
    outbox.put_text("a", "two ")  # a's frame still waits: the text joins it, ahead of the error
    outbox.put_text("b", "dos ")
    assert len(outbox) == 3
    first = asyncio.run(outbox.get())
    assert msgspec.json.decode(first) == {"type": "token", "id": "a", "text": "one two "}
    outbox.put_text("a", "three ")  # a's frame was taken: a new one queues behind the rest
    assert [(f["type"], f.get("id"), f.get("text")) for f in drain(outbox)] == [
        ("token", "b", "uno dos "),
        ("error", "c", None),
        ("token", "a", "three "),
    ]
    assert outbox.num_bytes == 0


def test_many_tokens_for_a_reader_that_never_reads_stay_one_frame_per_request():
    outbox = Outbox()
    for i in range(10_000):
        outbox.put_text(f"r{i % 3}", f"w{i} ")
    assert len(outbox) == 3
    sizes = [len(f) for f in [asyncio.run(outbox.get()) for _ in range(3)]]
    assert outbox.num_bytes == 0 and outbox.is_empty
    assert sum(sizes) > 10_000 * 3  # all of the text, in three frames


def test_a_reader_waits_for_the_next_frame():
    async def main():
        outbox = Outbox()
        reader = asyncio.create_task(outbox.get())
        await asyncio.sleep(0)
        assert not reader.done()
        outbox.put_text("r", "hi")
        return msgspec.json.decode(await asyncio.wait_for(reader, 5))

    assert asyncio.run(main()) == {"type": "token", "id": "r", "text": "hi"}
