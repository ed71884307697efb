"""The snapshot's prefix cache tiers (localserve/engine/snapshot.py, engine/metrics.py): the
host and disk tiers' occupancy and counters, restores counted by the tier their KV state came
from, and a restored sequence's row, on the fake runner."""

from __future__ import annotations

import random
from concurrent.futures import Future
from dataclasses import dataclass

from localserve.engine.events import Done
from localserve.engine.prefix_tiers import SavedPrefix, common_prefix
from localserve.engine.sampling_params import SamplingParams
from localserve.engine.snapshot import build_snapshot
from localserve.protocol.snapshot import PrefixTier

MIB = 1 << 20


def words(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 1000) for _ in range(n)]


def ask(h, rid: str, tokens: list[int], user: str) -> tuple[Done, list[int]]:
    """Run one turn to its end: its Done, and the prompt and reply (the next turn's start)."""
    h.engine.add_request(rid, tokens, SamplingParams(temperature=0, max_tokens=8), user)
    h.step()
    seq = h.engine._seqs[rid]
    h.run()
    return h.done(rid), seq.tokens[:-1]


@dataclass
class Stats:
    entries: int = 0
    bytes: int = 0
    budget_bytes: int = 64 * MIB
    enabled: bool = True
    evictions: int = 0
    problem: str = ""


class FakeDisk:
    """A disk tier in memory: what is put is kept, and a load hands back a copy marked as read
    from the disk. Its stats have only the fields the PrefixDisk protocol names."""

    def __init__(self) -> None:
        self.saved: list[SavedPrefix] = []

    def put(self, entry: SavedPrefix) -> None:
        self.saved.append(entry)

    def load(self, user, tokens, share_all, skip, have=0) -> Future | None:
        mine = [e for e in self.saved if e.owner == user and e.key not in skip]
        best = max(mine, key=lambda e: common_prefix(e.tokens, tokens), default=None)
        if best is None:
            return None
        copy = SavedPrefix(list(best.tokens), best.owner, best.nbytes, data=best.data)
        copy.from_disk = True
        future: Future = Future()
        future.set_result(copy)
        return future

    def stats(self) -> Stats:
        return Stats(len(self.saved), sum(e.nbytes for e in self.saved))

    def close(self) -> None:
        pass


def test_restores_are_counted_by_the_tier_their_state_came_from(make_harness):
    disk = FakeDisk()
    h = make_harness(host_cache_bytes=MIB, disk=disk, n_ctx=512, n_seq_max=8)
    _, alice = ask(h, "a-0", words(300, 1), "alice")
    ask(h, "evict", words(480, 2), "carol")  # alice's cells leave the pool; her copy stays
    done, alice = ask(h, "a-1", alice + [7], "alice")
    snap = build_snapshot(h.engine)
    host = h.kv.host
    assert snap.host_tier == PrefixTier(
        enabled=True,
        entries=len(host.entries),
        bytes=host.used_bytes,
        budget_bytes=MIB,
        hits=1,
        restored_tokens=done.cached_tokens,
        restored_bytes=snap.host_tier.restored_bytes,
        saved=host.counters.saved,
        saved_bytes=host.counters.saved_bytes,
        evictions=host.counters.evictions,
        failures=0,
    )
    assert done.cached_tokens > 300 and snap.host_tier.restored_bytes > 0
    assert snap.disk_tier.enabled and snap.disk_tier.entries == len(disk.saved) > 0
    assert snap.disk_tier.hits == 0

    # a restart: the host tier is empty, the disk gives alice's conversation back
    h = make_harness(host_cache_bytes=MIB, disk=disk, n_ctx=512, n_seq_max=8)
    done, _ = ask(h, "a-2", alice + [8], "alice")
    snap = build_snapshot(h.engine)
    assert done.cached_tokens > 300
    assert (snap.disk_tier.hits, snap.disk_tier.restored_tokens) == (1, done.cached_tokens)
    assert snap.host_tier.hits == snap.host_tier.restored_tokens == 0
    assert snap.counters.cached_tokens == done.cached_tokens  # the restore is in the reuse too


def test_a_restored_sequence_says_so_in_its_row_and_its_admission(make_harness):
    h = make_harness(host_cache_bytes=MIB, n_ctx=512, n_seq_max=8)
    _, alice = ask(h, "a-0", words(300, 1), "alice")
    ask(h, "evict", words(480, 2), "carol")
    h.engine.add_request("a-1", alice + [7], SamplingParams(temperature=0, max_tokens=8), "alice")
    h.step()
    (row,) = build_snapshot(h.engine).seqs
    restored = h.engine._seqs["a-1"].cached_tokens
    assert (row.restored_tokens, row.restored_from) == (restored, "host") and restored > 300
    admitted = [e for e in h.engine.metrics.events if e.kind == "admitted"][-1]
    assert admitted.detail.endswith(f"{restored} restored from host")
    h.run()
    assert h.engine.metrics.restored == {}  # a finished sequence's restore is forgotten


def test_a_preempted_sequence_restored_counts_as_a_host_hit(make_harness):
    h = make_harness(host_cache_bytes=MIB, n_ctx=600, n_seq_max=4)
    for rid, seed in (("a", 1), ("b", 2)):
        params = SamplingParams(temperature=0, max_tokens=150)
        h.engine.add_request(rid, words(200, seed), params, rid)
    h.run()
    snap = build_snapshot(h.engine)
    assert snap.counters.preemptions > 0
    assert snap.host_tier.hits == h.kv.host.counters.hits > 0
    assert snap.host_tier.restored_tokens > 0


def test_without_tiers_the_snapshot_says_they_are_off(make_harness):
    h = make_harness(n_ctx=512, n_seq_max=8)
    ask(h, "a-0", words(300, 1), "alice")
    snap = build_snapshot(h.engine)
    assert snap.host_tier == PrefixTier(saved=0) and snap.disk_tier == PrefixTier()
    assert all(r.restored_from == "" for r in snap.seqs)


def test_a_disk_tier_that_is_off_gives_its_reason(make_harness):
    disk = FakeDisk()
    disk.stats = lambda: Stats(budget_bytes=4 * MIB, enabled=False, problem="no room on /var")
    h = make_harness(host_cache_bytes=MIB, disk=disk, n_ctx=512, n_seq_max=8)
    tier = build_snapshot(h.engine).disk_tier
    assert (tier.enabled, tier.problem, tier.budget_bytes) == (False, "no room on /var", 4 * MIB)
