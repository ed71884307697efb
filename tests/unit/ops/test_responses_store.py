"""The Responses API's store (localserve/ops/responses_store.py): a response kept is read back by
its owner only, a chain is read oldest first within the person's rows, the depth bound is
decided without a walk, a broken chain is said, and each person's share is bounded (count and
bytes, the oldest dropped; one response too large is not kept). Through the server:
tests/e2e/test_responses_api.py."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from localserve.config import ServerConfig
from localserve.ops.responses_store import (
    DATABASE,
    ChainBroken,
    ChainTooDeep,
    ChainTooLarge,
    ResponseStore,
    StoredResponse,
)


def stored(id: str, previous: str | None = None, depth: int = 1, size: int = 10):
    return StoredResponse(id=id, model="m", previous=previous, depth=depth, body=b"{}",
                          chain_bytes=depth * 100, turns=id.encode(),
                          input=b"x" * size)  # fmt: skip


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def store(tmp_path):
    made = ResponseStore(tmp_path / DATABASE, max_count=5, max_bytes=64 << 10)
    yield made
    made.close()


def put_chain(store: ResponseStore, user: str, depth: int, prefix: str = "r") -> str:
    async def each():
        previous = None
        for d in range(1, depth + 1):
            await store.put(user, stored(f"{prefix}{d}", previous, d))
            previous = f"{prefix}{d}"
        return previous

    return run(each())


def test_a_response_is_kept_for_its_owner_only(tmp_path):
    store = ResponseStore.open(ServerConfig(state_dir=str(tmp_path)))
    assert store.path == tmp_path / DATABASE and store.max_count == 1000
    assert run(store.put("ann", stored("r1")))
    assert run(store.get("ann", "r1")).turns == b"r1"
    assert run(store.get("ben", "r1")) is None  # another person's id: as if unknown
    assert not run(store.delete("ben", "r1"))
    assert run(store.delete("ann", "r1")) and run(store.get("ann", "r1")) is None
    store.close()
    assert (tmp_path / DATABASE).stat().st_mode & 0o777 == 0o600


def test_a_chain_is_read_oldest_first_among_the_persons_rows_only(store):
    leaf = put_chain(store, "ann", 3)
    chain = run(store.chain("ann", leaf, 100, 1 << 20))
    assert chain.turns == [b"r1", b"r2", b"r3"] and (chain.depth, chain.bytes) == (3, 300)
    with pytest.raises(KeyError):
        run(store.chain("ben", leaf, 100, 1 << 20))
    # ben's own r2 continuing ann's r1 does not reach ann's row
    run(store.put("ben", stored("r2", "r1", 2)))
    with pytest.raises(ChainBroken):
        run(store.chain("ben", "r2", 100, 1 << 20))


def test_a_chain_at_the_bound_is_refused_from_its_depth_without_a_walk(store, tmp_path):
    leaf = put_chain(store, "ann", 4)
    assert run(store.chain("ann", "r3", 4, 1 << 20)).depth == 3  # one more fits
    with pytest.raises(ChainTooDeep) as refused:
        run(store.chain("ann", leaf, 4, 1 << 20))
    assert (refused.value.depth, refused.value.max_depth) == (4, 4)
    # a claimed depth of a million is refused at once, whatever its rows
    run(store.put("ann", stored("deep", "r4", 1_000_000)))
    with pytest.raises(ChainTooDeep):
        run(store.chain("ann", "deep", 100, 1 << 20))


def test_a_chain_past_its_bytes_is_refused_from_its_row(store):
    leaf = put_chain(store, "ann", 3)  # 100 bytes of turns each, by the rows' word
    assert run(store.chain("ann", leaf, 100, 300)).bytes == 300
    with pytest.raises(ChainTooLarge) as refused:
        run(store.chain("ann", leaf, 100, 299))
    assert (refused.value.size, refused.value.max_bytes) == (300, 299)


def test_a_chain_whose_oldest_was_deleted_is_broken(store):
    leaf = put_chain(store, "ann", 3)
    run(store.delete("ann", "r1"))
    with pytest.raises(ChainBroken) as broken:
        run(store.chain("ann", leaf, 100, 1 << 20))
    assert "'r1'" in str(broken.value)


def test_past_the_count_the_persons_oldest_are_dropped_and_nobody_elses(store):
    run(store.put("ben", stored("b1")))
    put_chain(store, "ann", 7)
    db = sqlite3.connect(store.path)
    ids = [i for (i,) in db.execute("SELECT id FROM responses WHERE user = 'ann' ORDER BY rowid")]
    db.close()
    assert ids == ["r3", "r4", "r5", "r6", "r7"]
    assert run(store.get("ben", "b1")) is not None


def test_past_the_bytes_the_oldest_are_dropped_and_one_too_large_is_not_kept(tmp_path):
    store = ResponseStore(tmp_path / DATABASE, max_count=1000, max_bytes=64 << 10)
    big = (64 << 10) // 16 - 20  # just under max_item_bytes with body and turns
    for i in range(20):
        assert run(store.put("ann", stored(f"r{i}", size=big)))
    db = sqlite3.connect(store.path)
    count, used = db.execute("SELECT COUNT(*), SUM(bytes) FROM responses").fetchone()
    db.close()
    assert used <= 64 << 10 and count == 16  # rows of about 4 KiB each
    assert run(store.get("ann", "r19")) is not None and run(store.get("ann", "r0")) is None
    assert not run(store.put("ann", stored("huge", size=64 << 10)))  # over max_item_bytes
    assert run(store.get("ann", "huge")) is None
    store.close()


def test_the_whole_store_is_bounded_everyones_oldest_dropped_first(tmp_path):
    """Many names (an open server's invented users) each within their own share: past the
    store's bounds everyone's oldest go first; its totals are kept across a restart."""
    path = tmp_path / "responses.sqlite3"
    store = ResponseStore(path, 1000, 64 << 20, max_total_count=5, max_total_bytes=10 << 20)

    async def put_all():
        for i in range(8):
            await store.put(f"name{i}", stored(f"resp_{i}"))

    asyncio.run(put_all())
    assert store.total_count == 5
    kept = [
        u for (u,) in sqlite3.connect(path).execute("SELECT user FROM responses ORDER BY rowid")
    ]
    assert kept == [f"name{i}" for i in range(3, 8)]
    assert asyncio.run(store.delete("name7", "resp_7")) and store.total_count == 4
    size = store.total_bytes
    store.close()
    again = ResponseStore(path, 1000, 64 << 20, max_total_count=5, max_total_bytes=size)
    assert (again.total_count, again.total_bytes) == (4, size)
    asyncio.run(again.put("late", stored("resp_late")))  # over the bytes: the oldest go
    assert again.total_bytes <= size and asyncio.run(again.get("name3", "resp_3")) is None
    assert asyncio.run(again.get("late", "resp_late")) is not None
    again.close()
