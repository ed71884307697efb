"""What the history measures: the newest snapshot and its trends, counters and shares, computed
once into a `Signals` that the rules only read. How each is measured: docs/diagnosis.md.

Tested in tests/unit/tui/diagnosis/test_diagnosis.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from localserve.protocol.snapshot import Percentiles, SeqRow, Snapshot
from tui.diagnosis.thresholds import (
    COUNTER_WINDOW_S,
    ITL_RISE_MIN_S,
    KV_FULL_SHARE,
    QUEUE_DOMINANT_SHARE,
    QUEUE_WAIT_HIGH_S,
    RISING_RATIO,
    TREND_LOOKBACK_S,
    TREND_MIN_SPAN_S,
    TTFT_HIGH_S,
    TTFT_PENDING_S,
    TTFT_RISE_MIN_S,
)


class Holding:
    """One user's share of the server now."""

    def __init__(self, user: str) -> None:
        self.user = user
        self.running = 0
        self.cells = 0  # live cells of its own (a shared system prompt's not counted)
        self.waiting = 0
        self.longest_wait = 0.0


class Signals:
    """The newest snapshot (`now`) plus what the history says about it. Built once per
    diagnosis from the history since the last restart; nothing changes it afterwards."""

    def __init__(self, seg: list[Snapshot]) -> None:
        self.seg = seg
        self.now = seg[-1]
        self.ref = _reference(seg)
        self.trend_s = self.now.uptime_s - self.ref.uptime_s if self.ref is not None else 0.0
        self._engine(self.now)
        self._load(self.now)
        self._kv(self.now)
        self._latency(self.now)
        self._counters(seg)
        self._tiers(seg)
        self._steps(self.now)
        self._holders(self.now)

    def _engine(self, s: Snapshot) -> None:
        """Whether the engine serves ("" when it does), and the RPC workers found down."""
        self.engine_problem = " ".join(s.engine_problem.split())
        self.workers_down = [w for w in s.workers if not w.up]
        self.runs_on = _runs_on(s)

    def _load(self, s: Snapshot) -> None:
        """Running and waiting now, and how long the queue has waited."""
        self.running, self.waiting = max(0, s.running), max(0, s.waiting)
        phases = [row.phase for row in s.seqs]
        self.prefilling = phases.count("prefill")
        self.decoding = len(phases) - self.prefilling if phases else self.running
        self.active = self.running > 0 or self.waiting > 0
        self.head = s.waiting_seqs[0] if s.waiting_seqs else None
        waits = [_num(w.waited_s) for w in s.waiting_seqs]
        self.max_wait = max((w for w in waits if w is not None), default=0.0)
        # how long "waiting, nothing running" has lasted; with one look the oldest wait is the
        # only clock
        self.stall_s = _stall_s(self.seg) if len(self.seg) >= 2 else self.max_wait

    def _kv(self, s: Snapshot) -> None:
        """KV cells: cached prefixes are evicted before any live sequence is touched, so they
        count as free here (the snapshot's kv_live and kv_live_used leave them out)."""
        self.kv_total = s.kv_total
        self.kv_cached = max(0, s.kv_cached)
        self.kv_live = max(0, s.kv_live)
        self.kv_live_used = max(0, s.kv_live_used)
        self.kv_share = self.kv_live / s.kv_total if s.kv_total > 0 else None
        self.kv_free = max(0, s.kv_total - self.kv_live)
        self.kv_full = self.kv_share is not None and self.kv_share >= KV_FULL_SHARE
        self.free_ids = max(0, s.free_seq_ids) + max(0, s.cached_prefixes)
        # the next waiting prompt needs more cells than are free
        need = self.head.prompt_tokens if self.head is not None else 0
        self.head_too_big = self.head is not None and s.kv_total > 0 and need > self.kv_free

    def _latency(self, s: Snapshot) -> None:
        """The latency windows, their trends, and whether TTFT is a problem of the queue."""
        ref = self.ref
        self.ttft_p50 = _num(s.ttft.p50)
        self.ttft_then = _num(ref.ttft.p50) if ref is not None else None
        self.ttft_rising = _rising(self.ttft_p50, self.ttft_then, TTFT_RISE_MIN_S)
        self.ttft_p90, self.ttft_mean = _num(s.ttft.p90), _num(s.ttft.mean)
        self.queue_p50, self.queue_mean = _num(s.queue.p50), _num(s.queue.mean)
        self.itl_p50, self.itl_p90 = _num(s.itl.p50), _num(s.itl.p90)
        self.itl_then = _num(ref.itl.p50) if ref is not None else None
        self.itl_rising = _rising(self.itl_p50, self.itl_then, ITL_RISE_MIN_S)
        target = _num(s.itl_target_s)
        self.target = target if target is not None and target > 0 else None

        self.queue_share = _share(s.queue, s.ttft)
        self.waiting_long = self.waiting > 0 and self.max_wait >= QUEUE_WAIT_HIGH_S
        self.queue_dominates = (
            self.queue_share is not None and self.queue_share >= QUEUE_DOMINANT_SHARE
        ) or (self.waiting_long and (self.ttft_p50 is None or self.max_wait >= self.ttft_p50))
        # a TTFT in the making: a request waits for admission or has prefilled a while. Without
        # one, the window's TTFT is the last minute's history, its cause gone (a finished long
        # prefill, a queue that has drained)
        self.ttft_pending = self.waiting > 0 or _longest_prefill_s(self.seg) >= TTFT_PENDING_S
        self.ttft_problem = self.active and (
            self.ttft_rising
            or (self.ttft_p50 is not None and self.ttft_p50 >= TTFT_HIGH_S)
            or self.waiting_long
        )

    def _counters(self, seg: list[Snapshot]) -> None:
        """How much each counter grew over about the last minute, and over how long."""
        self.preemptions, self.preempt_span = _counter_delta(seg, "preemptions")
        self.rejections, self.reject_span = _counter_delta(seg, "rejections")
        self.prefix_hits, self.prefix_span = _counter_delta(seg, "prefix_hits")
        self.reused_tokens = _counter_delta(seg, "cached_tokens")[0]
        self.prompt_tokens = _counter_delta(seg, "prompt_tokens")[0]
        self.prefix_evictions = _counter_delta(seg, "prefix_evictions")[0]

    def _tiers(self, seg: list[Snapshot]) -> None:
        """The prefix cache's tiers below the cells: whether host memory keeps copies of what
        leaves the cells (evicted prefixes, preempted sequences), and the restores of about the
        last minute (their tokens were copied back, not prefilled)."""
        s = seg[-1]
        self.host_tier, self.disk_tier = s.host_tier, s.disk_tier
        self.host_keeps = s.host_tier.enabled
        self.restores, self.restore_span = _growth(
            seg, lambda x: x.host_tier.hits + x.disk_tier.hits
        )
        self.disk_restores = _growth(seg, lambda x: x.disk_tier.hits)[0]
        self.restored_tokens = _growth(
            seg, lambda x: x.host_tier.restored_tokens + x.disk_tier.restored_tokens
        )[0]

    def _steps(self, s: Snapshot) -> None:
        """Per-step averages: how long a step takes and what shares prefill and Python take."""
        st = s.steps
        self.step_s = _num(st.step_s)
        self.prefill_share = _unit(st.prefill_time_share)
        self.engine_share = _unit(st.engine_share)
        self.decode_step_s = (
            self.step_s * (1 - (self.prefill_share or 0.0)) if self.step_s is not None else None
        )
        self.stretched_share = _unit(st.stretched_share) or 0.0
        slowdown = _num(st.slowdown)
        self.slowdown = slowdown if slowdown is not None and slowdown > 0 else None
        self.host = s.host
        ttft_target = _num(s.ttft_target_s)
        self.ttft_target = ttft_target if ttft_target is not None and ttft_target > 0 else None

    def _holders(self, s: Snapshot) -> None:
        """What each user holds now: running sequences, their own live cells, waiting requests
        (`Holding`, most running first), and the users with requests waiting."""
        held: dict[str, Holding] = {}
        for row in s.seqs:
            h = held.setdefault(row.user, Holding(row.user))
            h.running += 1
            h.cells += max(0, row.own_cells)
        for row in s.waiting_seqs:
            h = held.setdefault(row.user, Holding(row.user))
            h.waiting += 1
            h.longest_wait = max(h.longest_wait, _num(row.waited_s) or 0.0)
        self.holdings = sorted(held.values(), key=lambda h: (-h.running, -h.cells, -h.waiting))
        self.waiting_users = [h.user for h in self.holdings if h.waiting]


# --- history -----------------------------------------------------------------------------------


def segment(history: list[Snapshot]) -> list[Snapshot]:
    """The tail of the history since the last restart (uptime only grows within a run)."""
    start = len(history) - 1
    while start > 0 and history[start - 1].uptime_s <= history[start].uptime_s:
        start -= 1
    return history[start:]


def _at_or_before(seg: list[Snapshot], t: float) -> Snapshot | None:
    for s in reversed(seg):
        if s.uptime_s <= t:
            return s
    return None


def _reference(seg: list[Snapshot]) -> Snapshot | None:
    """The snapshot to compare with for trends, or None when the history is too short."""
    now = seg[-1].uptime_s
    ref = _at_or_before(seg[:-1], now - TREND_LOOKBACK_S)
    if ref is None and now - seg[0].uptime_s >= TREND_MIN_SPAN_S:
        ref = seg[0]
    return ref


def _counter_delta(seg: list[Snapshot], name: str) -> tuple[int, float]:
    """How much a counter grew over about the last minute, and over how many seconds."""
    return _growth(seg, lambda s: getattr(s.counters, name))


def _growth(seg: list[Snapshot], read: Callable[[Snapshot], int]) -> tuple[int, float]:
    """How much what `read` counts grew over about the last minute, and over how many seconds."""
    now = seg[-1]
    base = _at_or_before(seg[:-1], now.uptime_s - COUNTER_WINDOW_S)
    if base is None and now.uptime_s <= COUNTER_WINDOW_S:
        return max(0, read(now)), max(0.0, now.uptime_s)  # since start
    if base is None:
        base = seg[0]
    return max(0, read(now) - read(base)), now.uptime_s - base.uptime_s


def prefill_work(row: SeqRow) -> int:
    """The prompt tokens a row computes: those reused from cached cells or restored from a tier
    of the prefix cache are not prefill work (after a preemption without a restore, all are)."""
    if row.restored_from:
        reused = row.restored_tokens
    else:
        reused = 0 if row.num_preemptions else row.cached_tokens
    return max(0, row.prompt_tokens - reused)


def _longest_prefill_s(seg: list[Snapshot]) -> float:
    """How long the request prefilling now that the history first saw longest ago (waiting or
    running) has gone without its first token; 0 when none prefills."""
    now = seg[-1]
    prefilling = {r.request_id for r in now.seqs if r.phase == "prefill"}
    first: dict[str, float] = {}
    for s in seg:
        for rid in [r.request_id for r in s.seqs] + [w.request_id for w in s.waiting_seqs]:
            if rid in prefilling:
                first.setdefault(rid, s.uptime_s)
    return max((now.uptime_s - t for t in first.values()), default=0.0)


def _stall_s(seg: list[Snapshot]) -> float:
    """How long the newest run of 'waiting, nothing running' snapshots has lasted."""
    first = seg[-1]
    for s in reversed(seg):
        if not (s.waiting > 0 and s.running == 0):
            break
        first = s
    return seg[-1].uptime_s - first.uptime_s


# --- numbers -----------------------------------------------------------------------------------


def _num(x: float | None) -> float | None:
    """A finite number or None."""
    if x is None or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)


def _unit(x: float | None) -> float | None:
    x = _num(x)
    return None if x is None else min(1.0, max(0.0, x))


def _share(part: Percentiles, whole: Percentiles) -> float | None:
    """part / whole by means, falling back to p50s; None when either is missing or zero."""
    for a, b in ((part.mean, whole.mean), (part.p50, whole.p50)):
        a, b = _num(a), _num(b)
        if a is not None and b is not None and b > 0:
            return max(0.0, a / b)
    return None


def _rising(now: float | None, then: float | None, min_delta: float) -> bool:
    if now is None or then is None:
        return False
    return now >= RISING_RATIO * then and now - then >= min_delta


def _runs_on(s: Snapshot) -> str:
    """Where the model computes, as the idle line names it: "CPU" when every layer is on this
    machine's CPU (no device list: a CPU build, or none offloaded), "GPU" on a local
    accelerator, "devices" for a model split across RPC workers (they may be either)."""
    m = s.model
    names = [d.name for d in m.devices if d.layers > 0] or [d.name for d in m.devices]
    if any(name.startswith("RPC") for name in names):
        return "devices"
    if names:
        return "CPU" if all(name == "CPU" for name in names) else "GPU"
    return "CPU" if m.backend.upper() == "CPU" or m.n_gpu_layers <= 0 else "GPU"
