"""The KV pool's accounting on its own (localserve/engine/kv.py): cells, sequence ids, roots.

Prefix reuse through the engine is in test_kv_prefix_cache.py; the scheduler's use of the pool
in test_scheduler.py.
"""

from __future__ import annotations

import random

import pytest

from localserve.engine.kv import KVPool, common_prefix
from localserve.engine.sampling_params import SamplingParams
from localserve.engine.sequence import Sequence

GREEDY = SamplingParams(temperature=0, max_tokens=8)


def words(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 1000) for _ in range(n)]


def test_a_pool_needs_a_cell_and_a_sequence_id():
    with pytest.raises(ValueError):
        KVPool(0, 4)
    with pytest.raises(ValueError):
        KVPool(16, 0)


def test_common_prefix():
    assert common_prefix([1, 2, 3, 4], [1, 2, 9]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    a = list(range(1000))
    for cut in (0, 1, 499, 999):
        assert common_prefix(a, a[:cut] + [-1] + a[cut + 1 :]) == cut


def test_a_root_shared_by_a_live_sequence_is_never_evicted():
    pool = KVPool(1000, 4, prefix_caching=True)
    seq = Sequence("s", words(100, 70) + words(20, 71), GREEDY, "u")
    seq.system_tokens = 100
    assert pool.try_admit(seq, pool.match(seq))
    pool.computed(seq, 120)  # the system prompt is computed: it becomes a root
    assert [op.kind for op in pool.take_ops()] == ["copy"]
    assert pool.num_used == 120 and pool.num_cached == 0
    assert pool.evict_all() == 0  # the root's cells are live: seq shares them
    pool.release(seq, keep=True)  # its own 20 cells stay as a prefix on top of the root
    assert pool.num_used == 120 and pool.num_cached == 120 and len(pool.prefixes) == 2
    assert pool.evict_all() == 2  # the child first, then the root it no longer shares
    assert pool.num_used == pool.num_committed == 0 and pool.num_free_seq_ids == 4
    assert sorted(op.kind for op in pool.take_ops()) == ["free", "free"]
