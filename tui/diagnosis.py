"""What an operator would conclude from the recent stats: one plain-words headline and its numbers.

`diagnose(history)` takes the monitor's recent `Snapshot`s, oldest first (about two minutes, one
every 0.5 s), and returns a `Diagnosis`: a level (`ok` < `info` < `warn` < `bad`), a headline of
at most 100 characters naming the most severe finding and its likely mechanism, and detail lines
with the numbers behind it, the other findings and a one-line picture of the moment. It is a pure
function of the snapshots (no clock, no I/O, imports only `localserve.protocol`, msgspec and the
standard library) and never raises: an empty history, null percentiles or a zero-sized cache give
a quieter answer, not an error.

Reading the numbers
-------------------
- *Now* is the newest snapshot. Latency figures are the engine's 60 s windows (p50/p90/mean,
  null when empty), so they lag; live figures (running, waiting, how long the oldest waiting
  request has waited, KV cells, per-step averages over the last 32 steps) lead.
- *Rising* compares the newest p50 with the p50 of the latest snapshot at least
  `TREND_LOOKBACK_S` (45 s) older, or with the oldest snapshot when the history spans at least
  `TREND_MIN_SPAN_S` (15 s): rising = now >= `RISING_RATIO` (1.5) x then, and by at least
  `TTFT_RISE_MIN_S` (250 ms) for TTFT or `ITL_RISE_MIN_S` (10 ms) for ITL. With less history
  there is no trend, only levels. A drop in uptime (the server restarted) starts the history
  afresh.
- *Increasing counters* (preemptions, rejections) are the newest value minus the value
  `COUNTER_WINDOW_S` (60 s) earlier, or minus the oldest snapshot's when the history is shorter,
  or minus zero when the engine itself is younger than the window.
- *Queue share* is mean queue time / mean TTFT over the window (TTFT = queue + prefill + the
  first sample, so means add up; p50s stand in when a mean is missing). Time in queue
  *dominates* when the share is >= `QUEUE_DOMINANT_SHARE` (0.5), or when requests are waiting
  now and the oldest has waited >= `QUEUE_WAIT_HIGH_S` (2 s) and at least the TTFT p50.
- *TTFT is a problem* when it is rising, when its p50 is >= `TTFT_HIGH_S` (2 s), or when a
  request has already waited >= `QUEUE_WAIT_HIGH_S` in the queue (its TTFT will be at least
  that). Level `warn`; `bad` from `TTFT_BAD_S` (10 s) or when sequences are being preempted.
- *KV is full* when live committed cells / total >= `KV_FULL_SHARE` (0.9). Live committed =
  committed (used + promised to admitted prompts) minus the cells only cached prefixes hold:
  finished conversations and system prompts kept for reuse are evicted on demand before any
  live sequence is touched, so they are free for every purpose here (free cells = total - live
  committed) and a cache full of them is not pressure. Likewise the sequence ids cached
  prefixes hold count as free.
- Window-based TTFT and ITL findings are only made while something runs or waits; once the
  engine is quiet they would describe a burst that is over.

The reasoning table, most severe first
-------------------------------------
The headline names the first finding that applies (by level, then in this order); the details
list the others. Each entry: level, when, an example headline, the mechanism it names.

1. admission blocked (bad). Waiting > 0 and running == 0 for >= `ADMISSION_STALL_S` (2 s).
   "admission blocked for 5.0 s: 3 waiting, 0 running — the scheduler admits nothing".
   The next prompt does not fit the free cells, no sequence id is free, or cells stay
   committed with nothing running (cached prefixes aside; the engine counts no steps without
   a batch, so a stall cannot be told from an empty batch).
2. turning requests away (bad). The rejection counter grew in the last minute.
   "turning requests away: 12 rejected in the last minute, 40 queued — the queue bound is
   reached". The server refuses `busy` (queue or per-user bounds), `too_long` and
   `shutting_down` requests; with nothing queued: per-user limits or over-long prompts.
3. capacity bound (warn; bad with preemptions or from `TTFT_BAD_S`). TTFT problem, time in
   queue dominates, and the KV cache is full, or preemptions grew, or the next waiting prompt
   needs more cells than are free. "TTFT rising: time in queue dominates and the KV cache is
   96% full — capacity bound". Active sequences' state exhausts the cache budget; admission
   waits until a whole prompt fits.
4. slot bound (warn/bad). TTFT problem, time in queue dominates, KV has room, running ==
   `max_num_seqs` (or no free sequence id). "TTFT rising: time in queue dominates and all 16
   sequence slots are busy — slot bound". Newcomers wait for a running sequence to finish.
5. queued for another reason (warn/bad; info once the queue has drained). TTFT problem, time in
   queue dominates, slots and KV free: the static policy holding newcomers until its batch
   drains, waiting users who already run their per-user share, or a burst that has passed.
6. prefill bound (warn/bad). TTFT problem, queue does not dominate, and prefill takes >=
   `PREFILL_BOUND_SHARE` (50%) of step time or a prompt of >= `LONG_PROMPT_TOKENS` (1024) tokens
   is prefilling. "TTFT rising: long prompts dominate the steps — prefill bound". Large
   prefills dominate scheduling; while others decode, the ITL target caps prefill per step
   (then: "long prompts advance 128 tokens a step beside 12 decoders — prefill bound").
7. TTFT, no single cause (warn/bad). "TTFT high: p50 3.1 s, no single cause (queue 30% of it,
   prefill 20% of steps)".
8. ITL (warn; bad from p50 >= `ITL_BAD_FACTOR` (2) x target). ITL p50 or p90 above
   `itl_target_s`. "ITL rising: 14 sequences decode at once; prefill chunks take 60% of each
   step" (at most two causes in the headline, in this order):
   - many decoders: 2+ decoding and the decode part of a step (step time x (1 - prefill share))
     >= `DECODE_STEP_OF_TARGET` (0.75) x target: decoders compete for iterations;
   - a lone decode step that slow: the model is slower than the target;
   - prefill share of step time >= `ITL_PREFILL_SHARE` (30%): prefill chunks delay decodes;
   - engine share (time outside llama_decode) >= `ENGINE_SHARE_HIGH` (30%): Python overhead;
   - none of these and fast steps now: "ITL easing" (info) — the slow gaps are in the window
     but behind us (a finished long prefill, preemptions).
9. preempting (warn). Preemptions grew and no finding above named them. "preempting: 5
   preemptions in the last minute — capacity bound". Decode growth ran out of cells; the
   newest sequence lost its cells and recomputes.
10. KV nearly full (info). "KV cache 93% committed: new prompts will wait for cells".
11. ITL rising under the target (info). "ITL rising: p50 40 ms → 90 ms, still under the 120 ms
    target".
12. idle (info). Nothing running or waiting and no tokens in the last 10 s. "accelerator idle:
    no eligible work": the scheduler has nothing to give the accelerator.
13. healthy (ok). Otherwise: "healthy: 3 streaming, TTFT p50 180 ms, ITL p50 45 ms, KV 23%".

The picture of the moment ends the details: running and waiting, the latency windows, KV cells
and, while a prefix cache is in use, how much of the prompt tokens of the last minute it served
("prefix cache: 64% of prompt tokens reused in the last minute (17 hits); 1,234 cells cached in
5 prefixes"). Reuse is good news, not a finding: it never takes the headline.

These follow the troubleshooting table of the design notes:
TTFT under load → queue time, prompt lengths, prefill time; streaming smoothness → ITL and active
sequences; concurrency ceiling → KV usage and context lengths; utilisation → running/waiting and
batch tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import msgspec

from localserve.protocol import Percentiles, Snapshot

# --- thresholds (see the module docstring for how they are used) ------------------------------

TREND_LOOKBACK_S = 45.0  # compare the newest p50 with one at least this much older
TREND_MIN_SPAN_S = 15.0  # less history than this: no trend, only levels
COUNTER_WINDOW_S = 60.0  # "in the last minute" for preemptions and rejections
RISING_RATIO = 1.5  # rising = now >= 1.5 x then ...
TTFT_RISE_MIN_S = 0.25  # ... and at least 250 ms more (TTFT)
ITL_RISE_MIN_S = 0.010  # ... and at least 10 ms more (ITL)
TTFT_HIGH_S = 2.0  # TTFT p50 this high is a problem even when flat
TTFT_BAD_S = 10.0  # TTFT p50 (or the oldest wait) this high: level bad
QUEUE_WAIT_HIGH_S = 2.0  # a waiting request has waited this long: TTFT problem, queue evidence
QUEUE_DOMINANT_SHARE = 0.5  # mean queue time / mean TTFT at or above: time in queue dominates
KV_FULL_SHARE = 0.9  # committed / total KV cells at or above: the cache is nearly full
LONG_PROMPT_TOKENS = 1024  # a prompt this long, prefilling, makes the steps prefill-heavy
PREFILL_BOUND_SHARE = 0.5  # prefill share of step time at or above: prefill dominates steps
ITL_PREFILL_SHARE = 0.3  # prefill share of step time at or above: named as an ITL cause
DECODE_STEP_OF_TARGET = 0.75  # decode part of a step >= 0.75 x ITL target: decoders contend
ENGINE_SHARE_HIGH = 0.3  # time outside llama_decode at or above: named as an ITL cause
ITL_BAD_FACTOR = 2.0  # ITL p50 >= 2 x target: level bad
ADMISSION_STALL_S = 2.0  # waiting with nothing running this long: admission blocked
HEADLINE_MAX = 100  # characters

LEVELS = ("ok", "info", "warn", "bad")  # in order of severity


class Diagnosis(msgspec.Struct, frozen=True):
    level: str  # "ok" | "info" | "warn" | "bad"
    headline: str  # one line, plain words, at most HEADLINE_MAX characters
    details: list[str] = msgspec.field(default_factory=list)  # supporting lines with numbers


def diagnose(history: Sequence[Snapshot]) -> Diagnosis:
    """The most severe finding in `history` (oldest first) as a headline, the rest as details."""
    try:
        return _diagnose(list(history))
    except Exception as e:  # a monitor must keep running; the tests make sure this is never hit
        return Diagnosis("info", "no diagnosis: unexpected stats", [f"{type(e).__name__}: {e}"])


# --- internals ---------------------------------------------------------------------------------


class _Finding(NamedTuple):
    level: str
    headline: str
    details: list[str]


def _diagnose(history: list[Snapshot]) -> Diagnosis:
    if not history:
        return Diagnosis("info", "no stats yet", ["waiting for the first snapshot from the server"])
    ctx = _Context(_segment(history))
    findings = [f for check in _CHECKS if (f := check(ctx)) is not None]  # the table's order
    if not findings:
        findings.append(_Finding("ok", "healthy: " + ctx.summary(), []))
    rank = {level: i for i, level in enumerate(LEVELS)}
    findings.sort(key=lambda f: -rank[f.level])  # stable: same level keeps the table's order
    top, rest = findings[0], findings[1:]
    details = list(top.details)
    details += [f"also ({f.level}): {f.headline}" for f in rest]
    details += ctx.now_lines()
    return Diagnosis(top.level, _clip(top.headline), [_clip(d, 200) for d in details])


class _Context:
    """The newest snapshot plus what the history says about it, computed once."""

    def __init__(self, seg: list[Snapshot]) -> None:
        self.seg = seg
        s = self.now = seg[-1]
        self.ref = _reference(seg)
        self.trend_s = s.uptime_s - self.ref.uptime_s if self.ref is not None else 0.0

        self.running, self.waiting = max(0, s.running), max(0, s.waiting)
        phases = [row.phase for row in s.seqs]
        self.prefilling = phases.count("prefill")
        self.decoding = len(phases) - self.prefilling if phases else self.running
        self.active = self.running > 0 or self.waiting > 0
        self.kv_total = s.kv_total
        # cached prefixes are evicted before any live sequence is touched: not pressure
        self.kv_cached = max(0, s.kv_cached)
        self.kv_live = max(0, s.kv_committed - self.kv_cached)
        self.kv_live_used = max(0, s.kv_used - self.kv_cached)
        self.kv_share = self.kv_live / s.kv_total if s.kv_total > 0 else None
        self.kv_free = max(0, s.kv_total - self.kv_live)
        self.free_ids = max(0, s.free_seq_ids) + max(0, s.cached_prefixes)
        self.head = s.waiting_seqs[0] if s.waiting_seqs else None
        waits = [_num(w.waited_s) for w in s.waiting_seqs]
        self.max_wait = max((w for w in waits if w is not None), default=0.0)

        self.ttft_p50 = _num(s.ttft.p50)
        self.ttft_then = _num(self.ref.ttft.p50) if self.ref is not None else None
        self.ttft_rising = _rising(self.ttft_p50, self.ttft_then, TTFT_RISE_MIN_S)
        self.itl_p50, self.itl_p90 = _num(s.itl.p50), _num(s.itl.p90)
        self.itl_then = _num(self.ref.itl.p50) if self.ref is not None else None
        self.itl_rising = _rising(self.itl_p50, self.itl_then, ITL_RISE_MIN_S)
        self.target = _num(s.itl_target_s)
        if self.target is not None and self.target <= 0:
            self.target = None

        self.queue_share = _share(s.queue, s.ttft)
        self.waiting_long = self.waiting > 0 and self.max_wait >= QUEUE_WAIT_HIGH_S
        self.queue_dominates = (
            self.queue_share is not None and self.queue_share >= QUEUE_DOMINANT_SHARE
        ) or (self.waiting_long and (self.ttft_p50 is None or self.max_wait >= self.ttft_p50))
        self.ttft_problem = self.active and (
            self.ttft_rising
            or (self.ttft_p50 is not None and self.ttft_p50 >= TTFT_HIGH_S)
            or self.waiting_long
        )
        self.ttft_word = "TTFT rising" if self.ttft_rising else "TTFT high"

        self.preemptions, self.preempt_span = _counter_delta(seg, "preemptions")
        self.rejections, self.reject_span = _counter_delta(seg, "rejections")
        self.prefix_hits, self.prefix_span = _counter_delta(seg, "prefix_hits")
        self.reused_tokens = _counter_delta(seg, "cached_tokens")[0]
        self.prompt_tokens = _counter_delta(seg, "prompt_tokens")[0]
        self.prefix_evictions = _counter_delta(seg, "prefix_evictions")[0]

        st = s.steps
        self.step_s = _num(st.step_s)
        self.prefill_share = _unit(st.prefill_time_share)
        self.engine_share = _unit(st.engine_share)
        self.decode_step_s = (
            self.step_s * (1 - (self.prefill_share or 0.0)) if self.step_s is not None else None
        )
        self.claimed: set[str] = set()  # what a finding already explained

    # the words for what is going on now ------------------------------------------------------

    def summary(self) -> str:
        parts = []
        if self.running:
            parts.append(f"{self.decoding} streaming")
            if self.prefilling:
                parts.append(f"{self.prefilling} prefilling")
        else:
            parts.append("nothing running")
        if self.waiting:
            parts.append(f"{self.waiting} queued")
        parts.append(f"TTFT p50 {duration(self.ttft_p50)}")
        parts.append(f"ITL p50 {duration(self.itl_p50)}")
        if self.kv_share is not None:
            parts.append(f"KV {_pct(self.kv_share)}")
        return ", ".join(parts)

    def now_lines(self) -> list[str]:
        s = self.now
        lines = [
            f"now: {self.running} running ({self.decoding} decoding, {self.prefilling} "
            f"prefilling) of {s.max_num_seqs} slots, {self.waiting} waiting"
            + (f" (oldest {duration(self.max_wait)})" if self.waiting else ""),
            f"latency over {s.window_s:.0f} s: TTFT p50 {duration(self.ttft_p50)} "
            f"p90 {duration(_num(s.ttft.p90))}, queue p50 {duration(_num(s.queue.p50))}, "
            f"ITL p50 {duration(self.itl_p50)} p90 {duration(self.itl_p90)} "
            f"(target {duration(self.target)})",
        ]
        kv = f"KV {_pct(self.kv_share)} committed" if self.kv_share is not None else "KV unknown"
        lines.append(
            f"{kv} ({self.kv_live:,} of {s.kv_total:,} cells, {self.kv_live_used:,} used); "
            f"{s.generation_tokens_per_s:.0f} tokens/s generated, "
            f"{s.prompt_tokens_per_s:.0f} prompt tokens/s"
        )
        return lines + self.prefix_lines()

    def prefix_lines(self) -> list[str]:
        """How much the prefix cache served lately and what it holds (nothing when unused)."""
        s = self.now
        if not (self.prefix_hits or self.kv_cached or s.cached_prefixes > 0):
            return []
        held = f"{self.kv_cached:,} cells cached in {_n(s.cached_prefixes, 'prefix', 'es')}"
        when = _span(self.prefix_span)
        if self.prefix_hits:
            share = (
                min(1.0, self.reused_tokens / self.prompt_tokens) if self.prompt_tokens else None
            )
            line = (
                f"prefix cache: {_pct(share)} of prompt tokens reused {when} "
                f"({_n(self.prefix_hits, 'hit')}); {held}"
            )
        else:
            line = f"prefix cache: {held}, no reuse {when}"
        if self.prefix_evictions:
            line += f"; {_n(self.prefix_evictions, 'prefix', 'es')} evicted to make room"
        return [line]

    def trend_line(self, name: str, then: float | None, now: float | None) -> list[str]:
        if self.ref is None or then is None or now is None:
            return []
        return [f"{name} p50 {duration(then)} → {duration(now)} over the last {self.trend_s:.0f} s"]

    def queue_lines(self) -> list[str]:
        s, lines = self.now, []
        if self.queue_share is not None:
            lines.append(
                f"queue time is {_pct(self.queue_share)} of TTFT "
                f"(mean {duration(_num(s.queue.mean))} of {duration(_num(s.ttft.mean))})"
            )
        if self.waiting:
            lines.append(f"{self.waiting} waiting, the oldest for {duration(self.max_wait)}")
        return lines

    def cached_words(self) -> str:
        """A clause for KV lines: the cached cells they leave out, when there are any."""
        if not self.kv_cached:
            return ""
        return f"; {self.kv_cached:,} more hold cached prefixes, evicted on demand"

    def ttft_level(self) -> str:
        worst = max(self.ttft_p50 or 0.0, self.max_wait if self.waiting else 0.0)
        return "bad" if worst >= TTFT_BAD_S else "warn"


# --- the checks, in the table's order ----------------------------------------------------------


def _admission_blocked(c: _Context) -> _Finding | None:
    if not (c.waiting > 0 and c.running == 0):
        return None
    stalled = _stall_s(c.seg)
    if len(c.seg) < 2:
        stalled = c.max_wait  # one look: the oldest wait is the only clock
    if stalled < ADMISSION_STALL_S:
        return None
    s, head = c.now, c.head
    lead = f"admission blocked for {duration(stalled)}: {c.waiting:,} waiting, 0 running"
    details = [f"the oldest waiting request has waited {duration(c.max_wait)}"]
    if head is not None and c.kv_total > 0 and head.prompt_tokens > c.kv_free:
        why = f"next prompt needs {head.prompt_tokens:,} KV cells, {c.kv_free:,} free"
    elif c.free_ids <= 0:
        why = "no free sequence id"
        details.append("every sequence id is taken although nothing runs: ids are not released")
    else:
        why = "the scheduler admits nothing"
    if c.kv_live > 0:
        details.append(f"{c.kv_live:,} KV cells stay committed although nothing runs")
    details.append(f"KV {c.kv_live:,} of {s.kv_total:,} cells committed" + c.cached_words())
    c.claimed.add("ttft")  # the queue's TTFT is this finding's symptom
    return _Finding("bad", f"{lead} — {why}", details)


def _rejecting(c: _Context) -> _Finding | None:
    if c.rejections <= 0:
        return None
    n, when = c.rejections, _span(c.reject_span)
    if c.waiting > 0:
        head = f"turning requests away: {n:,} rejected {when}, {c.waiting:,} queued"
        head += " — the queue bound is reached"
    else:
        head = f"turning requests away: {n:,} rejected {when} — per-user limits or long prompts"
    details = [
        "rejections count busy refusals (queue full, per-user caps), prompts longer than the "
        "context and refusals while shutting down"
    ]
    return _Finding("bad", head, details)


def _capacity_bound(c: _Context) -> _Finding | None:
    if not (c.ttft_problem and c.queue_dominates):
        return None
    kv_full = c.kv_share is not None and c.kv_share >= KV_FULL_SHARE
    head = c.head
    head_blocked = (
        head is not None and c.running > 0 and c.kv_total > 0 and head.prompt_tokens > c.kv_free
    )
    if not (kv_full or c.preemptions > 0 or head_blocked):
        return None
    w = c.ttft_word
    if kv_full:
        line = f"{w}: time in queue dominates and the KV cache is {_pct(c.kv_share)} full"
    elif c.preemptions > 0:
        line = f"{w}: time in queue dominates and {_n(c.preemptions, 'preemption')} "
        line += _span(c.preempt_span)
    else:
        need = head.prompt_tokens if head is not None else 0
        line = f"{w}: queue dominates; the next prompt needs {need:,} KV cells, {c.kv_free:,} free"
    details = c.trend_line("TTFT", c.ttft_then, c.ttft_p50) + c.queue_lines()
    s = c.now
    details.append(
        f"KV cache: {c.kv_live:,} of {s.kv_total:,} cells committed ({_pct(c.kv_share)}), "
        f"{c.kv_live_used:,} hold computed tokens" + c.cached_words()
    )
    if c.preemptions > 0:
        details.append(
            f"{_n(c.preemptions, 'preemption')} {_span(c.preempt_span)}: sequences lost their "
            "cells and recompute"
        )
        c.claimed.add("preemptions")
    if head_blocked and head is not None:
        details.append(f"the next waiting prompt has {head.prompt_tokens:,} tokens")
    details.append(
        "admission waits until a whole prompt fits in free cells; running sequences grow into "
        "the rest"
    )
    c.claimed.update({"ttft", "kv"})
    level = "bad" if c.preemptions > 0 else c.ttft_level()
    return _Finding(level, line + " — capacity bound", details)


def _slot_bound(c: _Context) -> _Finding | None:
    if "ttft" in c.claimed or not (c.ttft_problem and c.queue_dominates):
        return None
    s = c.now
    if s.max_num_seqs > 0 and c.running >= s.max_num_seqs:
        slots = f"all {s.max_num_seqs} sequence slots are busy"
    elif c.free_ids <= 0 and c.running > 0:
        slots = f"all {c.running} sequence ids are in use"
    else:
        return None
    details = c.trend_line("TTFT", c.ttft_then, c.ttft_p50) + c.queue_lines()
    if c.kv_share is not None:
        details.append(f"the KV cache has room: {_pct(c.kv_share)} committed")
    details.append("every slot is taken; a newcomer waits for a running sequence to finish")
    c.claimed.add("ttft")
    line = f"{c.ttft_word}: time in queue dominates and {slots} — slot bound"
    return _Finding(c.ttft_level(), line, details)


def _queue_other(c: _Context) -> _Finding | None:
    if "ttft" in c.claimed or not (c.ttft_problem and c.queue_dominates):
        return None
    s, w = c.now, c.ttft_word
    details = c.trend_line("TTFT", c.ttft_then, c.ttft_p50) + c.queue_lines()
    c.claimed.add("ttft")
    if c.waiting == 0:
        line = f"{w}: time in queue dominated the last minute; the queue has drained"
        return _Finding("info", line, details)
    if s.policy == "static" and c.running > 0:
        line = f"{w}: time in queue dominates — the static policy holds {c.waiting:,} "
        line += "until the batch drains"
        details.append("static batching admits only when every running sequence has finished")
        return _Finding(c.ttft_level(), line, details)
    waiting_users = {row.user for row in s.waiting_seqs}
    running_users = {row.user for row in s.seqs}
    if waiting_users and waiting_users <= running_users:
        line = f"{w}: time in queue dominates — the waiting users already run their share"
        details.append(
            "slots and KV are free, but everyone waiting already has sequences running: "
            "the per-user cap holds the rest"
        )
    else:
        line = f"{w}: time in queue dominates although slots and KV are free"
        details.append("admission is lagging: check the engine's per-user cap and the watermark")
    return _Finding(c.ttft_level(), line, details)


def _prefill_bound(c: _Context) -> _Finding | None:
    if "ttft" in c.claimed or not c.ttft_problem or c.queue_dominates:
        return None
    s = c.now
    prefill_rows = [r for r in s.seqs if r.phase == "prefill"]
    longest = max(prefill_rows, key=lambda r: r.prompt_tokens, default=None)
    long_prompt = longest is not None and longest.prompt_tokens >= LONG_PROMPT_TOKENS
    share_high = c.prefill_share is not None and c.prefill_share >= PREFILL_BOUND_SHARE
    if not (share_high or long_prompt):
        return None
    details = c.trend_line("TTFT", c.ttft_then, c.ttft_p50) + c.queue_lines()
    st = s.steps
    if c.prefill_share is not None:
        details.append(
            f"prefill takes {_pct(c.prefill_share)} of step time "
            f"({_fmt(st.prefill_tokens)} prefill and {_fmt(st.decode_tokens)} decode tokens "
            f"per step)"
        )
    if longest is not None:
        left = max(0, longest.prompt_tokens - longest.computed_tokens)
        details.append(
            f"{_n(len(prefill_rows), 'prompt')} prefilling, the longest {longest.prompt_tokens:,}"
            f" tokens ({left:,} left)"
        )
    capped = (
        s.policy == "continuous"
        and c.decoding > 0
        and 0 < st.prefill_budget < s.max_num_batched_tokens
    )
    if capped:
        details.append(
            f"the {duration(c.target)} ITL target caps prefill at {st.prefill_budget:,} tokens per "
            f"step (of {s.max_num_batched_tokens:,}) while {c.decoding} decode"
        )
    c.claimed.add("ttft")
    if share_high or not (capped and longest is not None):
        line = f"{c.ttft_word}: long prompts dominate the steps — prefill bound"
    else:
        line = (
            f"{c.ttft_word}: long prompts advance {st.prefill_budget:,} tokens a step beside "
            f"{_n(c.decoding, 'decoder')} — prefill bound"
        )
    return _Finding(c.ttft_level(), line, details)


def _ttft_other(c: _Context) -> _Finding | None:
    if "ttft" in c.claimed or not c.ttft_problem:
        return None
    parts = []
    if c.queue_share is not None:
        parts.append(f"queue {_pct(c.queue_share)} of it")
    if c.prefill_share is not None:
        parts.append(f"prefill {_pct(c.prefill_share)} of steps")
    why = f" ({', '.join(parts)})" if parts else ""
    line = f"{c.ttft_word}: p50 {duration(c.ttft_p50)}, no single cause{why}"
    details = c.trend_line("TTFT", c.ttft_then, c.ttft_p50) + c.queue_lines()
    c.claimed.add("ttft")
    return _Finding(c.ttft_level(), line, details)


def _itl(c: _Context) -> _Finding | None:
    target = c.target
    if not c.active or target is None:
        return None
    p50_over = c.itl_p50 is not None and c.itl_p50 > target
    p90_over = c.itl_p90 is not None and c.itl_p90 > target
    if not (p50_over or p90_over):
        return None
    shown = c.itl_p50 if p50_over else c.itl_p90
    which = "p50" if p50_over else "p90"
    causes: list[str] = []
    details = c.trend_line("ITL", c.itl_then, c.itl_p50)
    details.append(f"ITL {which} {duration(shown)} against a {duration(target)} target")
    dstep = c.decode_step_s
    if c.decoding >= 2 and (dstep is None or dstep >= DECODE_STEP_OF_TARGET * target):
        causes.append(f"{c.decoding} sequences decode at once")
        if dstep is not None:
            details.append(f"the decode part of a step takes {duration(dstep)}")
    elif c.decoding <= 1 and dstep is not None and dstep >= DECODE_STEP_OF_TARGET * target:
        causes.append(f"a lone decode step takes {duration(dstep)}")
        details.append("the model is slower than the ITL target with a single decoder")
    if c.prefill_share is not None and c.prefill_share >= ITL_PREFILL_SHARE:
        causes.append(f"prefill chunks take {_pct(c.prefill_share)} of each step")
        details.append(
            f"prefill budget {c.now.steps.prefill_budget:,} tokens per step "
            f"({_fmt(c.now.steps.prefill_tokens)} used on average)"
        )
    if c.engine_share is not None and c.engine_share >= ENGINE_SHARE_HIGH:
        causes.append(f"engine overhead takes {_pct(c.engine_share)} of each step")
        details.append("time outside llama_decode: scheduling, batch filling, sampling, metrics")
    if c.preemptions > 0:
        details.append(
            f"{_n(c.preemptions, 'preemption')} {_span(c.preempt_span)}: preempted sequences "
            "pause while they recompute"
        )
    if not causes:
        if c.step_s is not None and c.step_s < DECODE_STEP_OF_TARGET * target:
            # the window still holds slow gaps, but today's steps are fast: it has passed
            c.claimed.add("itl")
            line = (f"ITL easing: {which} {duration(shown)} over the last minute, "
                    f"steps now take {duration(c.step_s)}")  # fmt: skip
            details.append("the slow gaps (a long prefill, preemptions) are behind; steps are fast")
            return _Finding("info", line, details)
        else:
            causes.append(f"steps average {duration(c.step_s)} with {c.decoding} decoding")
    word = "ITL rising" if c.itl_rising else "ITL high"
    line = f"{word}: " + "; ".join(causes[:2])
    details += [f"also: {cause}" for cause in causes[2:]]
    bad = c.itl_p50 is not None and c.itl_p50 >= ITL_BAD_FACTOR * target
    c.claimed.add("itl")
    return _Finding("bad" if bad else "warn", line, details)


def _preempting(c: _Context) -> _Finding | None:
    if c.preemptions <= 0 or "preemptions" in c.claimed:
        return None
    line = f"preempting: {_n(c.preemptions, 'preemption')} {_span(c.preempt_span)} — capacity bound"
    details = [
        "decode growth ran out of KV cells; the newest sequence lost its cells and recomputes",
        f"KV {_pct(c.kv_share)} committed",
    ]
    c.claimed.add("kv")
    return _Finding("warn", line, details)


def _kv_full(c: _Context) -> _Finding | None:
    if "kv" in c.claimed or c.kv_share is None or c.kv_share < KV_FULL_SHARE:
        return None
    line = f"KV cache {_pct(c.kv_share)} committed: new prompts will wait for cells"
    free = f"{c.kv_free:,} cells free of {c.kv_total:,}"
    if c.kv_cached:
        free += f" ({c.kv_cached:,} of them hold cached prefixes, evicted on demand)"
    return _Finding("info", line, [free])


def _itl_rising(c: _Context) -> _Finding | None:
    if "itl" in c.claimed or not (c.active and c.itl_rising):
        return None
    line = f"ITL rising: p50 {duration(c.itl_then)} → {duration(c.itl_p50)}"
    if c.target is not None:
        line += f", still under the {duration(c.target)} target"
    return _Finding("info", line, [f"{c.decoding} decoding now"])


def _idle(c: _Context) -> _Finding | None:
    s = c.now
    if c.active or s.generation_tokens_per_s > 0 or s.prompt_tokens_per_s > 0:
        return None
    details = []
    if s.events:
        last = s.events[-1]
        details.append(f"last activity {duration(max(0.0, s.uptime_s - last.t))} ago ({last.kind})")
    if c.ttft_p50 is not None:
        details.append(f"over the last minute TTFT p50 was {duration(c.ttft_p50)}")
    details.append("the scheduler has nothing to give the accelerator")
    return _Finding("info", "accelerator idle: no eligible work", details)


_CHECKS = (
    _admission_blocked,
    _rejecting,
    _capacity_bound,
    _slot_bound,
    _queue_other,
    _prefill_bound,
    _ttft_other,
    _itl,
    _preempting,
    _kv_full,
    _itl_rising,
    _idle,
)


# --- history helpers ---------------------------------------------------------------------------


def _segment(history: list[Snapshot]) -> list[Snapshot]:
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
    now = seg[-1]
    base = _at_or_before(seg[:-1], now.uptime_s - COUNTER_WINDOW_S)
    if base is None and now.uptime_s <= COUNTER_WINDOW_S:
        return max(0, getattr(now.counters, name)), max(0.0, now.uptime_s)  # since start
    if base is None:
        base = seg[0]
    delta = getattr(now.counters, name) - getattr(base.counters, name)
    return max(0, delta), now.uptime_s - base.uptime_s


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


def duration(s: float | None) -> str:
    """Seconds as a short human duration: 85 ms, 1.2 s, 45 s, 3 min (— for nothing)."""
    if s is None or not math.isfinite(s):
        return "—"
    if s < 1.0:
        return f"{s * 1000:.0f} ms"
    if s < 10.0:
        return f"{s:.1f} s"
    if s < 120.0:
        return f"{s:.0f} s"
    if s < 7200.0:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.0f} h"


def _pct(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x * 100:.0f}%"


def _fmt(x: float | None) -> str:
    x = _num(x)
    return "—" if x is None else f"{x:,.0f}"


def _n(count: int, noun: str, plural: str = "s") -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else plural)


def _span(seconds: float) -> str:
    if seconds >= COUNTER_WINDOW_S - 5:
        return "in the last minute"
    return f"in the last {seconds:.0f} s" if seconds >= 1 else "just now"


def _clip(text: str, limit: int = HEADLINE_MAX) -> str:
    text = " ".join(text.split())  # one line
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
