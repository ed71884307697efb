"""The snapshot: one look at the engine, built on its thread between steps.

Everything the monitor, the diagnosis and `/metrics` show comes from here, with the derived
numbers (live cells, each row's own cells, a request's client id) computed once. The prefix
cache's tiers are read from the host tier (`kv.host`) and the disk's `stats()`, their restores
from the metrics (which count them by the tier the KV state came from).

Tested in tests/unit/engine/test_engine.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import msgspec

from localserve.config import SchedulerConfig
from localserve.engine.embedding import EmbeddingRequest
from localserve.engine.kv import KVPool
from localserve.engine.metrics import Metrics
from localserve.engine.prefix_tiers import PrefixDisk
from localserve.engine.runner import Runner
from localserve.engine.scheduler import Scheduler
from localserve.engine.sequence import Sequence
from localserve.engine.waits import NEWCOMER, WaitForecast
from localserve.protocol.snapshot import EmbeddingRow, PrefixTier, SeqRow, Snapshot, WaitingRow


class SnapshotSource(Protocol):
    """What a snapshot reads of the engine (localserve.engine.engine.Engine has all of it)."""

    runner: Runner
    config: SchedulerConfig
    kv: KVPool
    scheduler: Scheduler
    metrics: Metrics
    forecast: WaitForecast
    clock: Callable[[], float]
    disk: PrefixDisk | None  # the disk tier, when the engine has one


def build_snapshot(engine: SnapshotSource) -> Snapshot:
    """Everything the monitor and /metrics show; call on the engine thread."""
    m, sched, kv, now = engine.metrics, engine.scheduler, engine.kv, engine.clock()
    cached = kv.num_cached
    prompt_tps, gen_tps = m.throughput()
    embed_inputs_ps, embed_tokens_ps = m.embed_throughput()
    return Snapshot(
        uptime_s=now - m.start_time,
        model=engine.runner.info,
        policy=engine.config.policy,
        max_num_seqs=sched.max_num_seqs,
        max_num_batched_tokens=sched.max_num_batched_tokens,
        itl_target_s=engine.config.itl_target_ms / 1e3,
        ttft_target_s=engine.config.ttft_target_ms / 1e3,
        running=len(sched.running),
        waiting=sched.num_waiting,
        kv_used=kv.num_used,
        kv_committed=kv.num_committed,
        kv_total=kv.num_cells,
        kv_cached=cached,
        kv_live=max(0, kv.num_committed - cached),
        kv_live_used=max(0, kv.num_used - cached),
        cached_prefixes=len(kv.prefixes),
        free_seq_ids=kv.num_free_seq_ids,
        window_s=m.window_s,
        **m.latency(),
        prompt_tokens_per_s=prompt_tps,
        generation_tokens_per_s=gen_tps,
        steps=m.step_stats(sched.last_prefill_budget),
        counters=msgspec.structs.replace(m.counters, prefix_evictions=kv.num_evictions),
        seqs=[seq_row(s, now, m.restored.get(s.request_id)) for s in sched.running],
        waiting_seqs=[
            waiting_row(i, s, now, engine.forecast.entry_in(s.request_id, now))
            for i, s in enumerate(sched.waiting_seqs(), 1)
        ],
        newcomer_wait_s=_newcomer_wait(engine),
        events=list(m.events),
        histograms=m.export_histograms(),
        embeddings=[embedding_row(r, now) for r in sched.embeddings.requests],
        embed_inputs_per_s=embed_inputs_ps,
        embed_tokens_per_s=embed_tokens_ps,
        host_tier=host_tier(engine),
        disk_tier=disk_tier(engine),
    )


def host_tier(engine: SnapshotSource) -> PrefixTier:
    """The host tier: its occupancy and counters, its hits those not read from the disk."""
    host, restores = engine.kv.host, engine.metrics.tiers["host"]
    c = host.counters
    return PrefixTier(
        enabled=host.enabled,
        entries=len(host.entries),
        bytes=host.used_bytes,
        budget_bytes=host.budget_bytes,
        hits=restores.hits,
        restored_tokens=restores.restored_tokens,
        restored_bytes=restores.restored_bytes,
        saved=c.saved,
        saved_bytes=c.saved_bytes,
        evictions=c.evictions,
        failures=c.failures,
    )


def disk_tier(engine: SnapshotSource) -> PrefixTier:
    """The disk tier as its stats() tell it (off without one), with the restores of what was
    read from it. Fields its stats may not have are 0."""
    disk = getattr(engine, "disk", None)
    if disk is None:
        return PrefixTier()
    stats, restores = disk.stats(), engine.metrics.tiers["disk"]

    def stat(name: str):
        return getattr(stats, name, 0)

    return PrefixTier(
        enabled=bool(getattr(stats, "enabled", False)),
        problem=str(getattr(stats, "problem", "")),
        entries=stat("entries"),
        bytes=stat("bytes"),
        budget_bytes=stat("budget_bytes"),
        hits=restores.hits,
        restored_tokens=restores.restored_tokens,
        restored_bytes=restores.restored_bytes,
        saved=stat("saved"),
        saved_bytes=stat("saved_bytes"),
        evictions=stat("evictions"),
        failures=stat("failures"),
    )


def embedding_row(request: EmbeddingRequest, now: float) -> EmbeddingRow:
    return EmbeddingRow(
        request_id=request.request_id,
        client_id=request.client_id,
        user=request.user,
        phase="running" if request.is_running else "waiting",
        inputs=len(request.inputs),
        inputs_done=request.num_done,
        tokens=request.num_tokens,
        tokens_done=request.num_tokens_done,
        waited_s=now - request.arrival_time,
    )


def seq_row(seq: Sequence, now: float, restored: tuple[int, str] | None = None) -> SeqRow:
    """A running sequence's row; `restored`: its latest restore (tokens, tier), if any."""
    ttft = seq.timings_s()[1]
    first, last = seq.first_token_time, seq.last_token_time
    n = seq.num_output_tokens
    return SeqRow(
        request_id=seq.request_id,
        client_id=seq.client_id,
        user=seq.user,
        phase="prefill" if seq.is_prefilling or seq.num_computed == 0 else "decode",
        prompt_tokens=seq.num_prompt_tokens,
        computed_tokens=seq.num_computed,
        output_tokens=n,
        cells=seq.num_cells,
        own_cells=seq.num_cells - seq.num_system,
        own_computed=max(0, seq.num_computed - seq.num_system),
        cached_tokens=seq.cached_tokens,
        tokens_per_s=(n - 1) / (last - first) if n > 1 and last > first else None,
        ttft_s=None if math.isnan(ttft) else ttft,
        last_itl_s=seq.last_itl_s,
        since_last_token_s=now - last if last is not None else None,
        num_preemptions=seq.num_preemptions,
        restored_tokens=restored[0] if restored else 0,
        restored_from=restored[1] if restored else "",
    )


def _newcomer_wait(engine: SnapshotSource) -> float | None:
    """About how long a new user's usual prompt would wait now (0 with nothing waiting and
    room to spare; the scheduler's state played forward, localserve.engine.waits)."""
    lengths = engine.forecast.lengths
    predicted = engine.scheduler.predict_waits(lengths, newcomer=lengths.typical_prompt)
    return predicted[NEWCOMER].wait_s


def waiting_row(
    position: int, seq: Sequence, now: float, predicted_wait_s: float | None = None
) -> WaitingRow:
    since = seq.queued_time if seq.queued_time is not None else now
    return WaitingRow(
        position=position,
        request_id=seq.request_id,
        client_id=seq.client_id,
        user=seq.user,
        prompt_tokens=seq.num_prompt_tokens,
        waited_s=seq.queue_s + now - since,
        is_preempted=seq.num_preemptions > 0,
        predicted_wait_s=predicted_wait_s,
    )
