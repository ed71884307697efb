"""What the signals mean: one rule per row of the reasoning table in docs/diagnosis.md.

Each rule is a pure function of the `Signals`: it returns a `Finding` or None and changes
nothing. A finding declares the causes it names (`explains`) and the causes it leaves to an
earlier finding (`defers_to`); `reported` walks the findings in the table's order and drops a
finding when one already reported explains what it defers to. That is the only coordination.

Tested in tests/unit/tui/diagnosis/test_diagnosis.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from localserve.protocol.frames import ModelStatus
from tui.diagnosis.signals import Holding, Signals, prefill_work
from tui.diagnosis.thresholds import (
    ADMISSION_STALL_S,
    COUNTER_WINDOW_S,
    DECODE_STEP_OF_TARGET,
    ENGINE_SHARE_HIGH,
    HEADLINE_MAX,
    HOLDER_FAIR_FACTOR,
    HOLDER_MIN_SEQS,
    HOLDER_SHARE,
    ITL_BAD_FACTOR,
    ITL_PREFILL_SHARE,
    LONG_PROMPT_TOKENS,
    OTHERS_CORES_SHARE,
    PREFILL_BOUND_SHARE,
    SLOWDOWN_ALONE,
    SLOWDOWN_BAD,
    SLOWDOWN_HIGH,
    STRETCHED_SHARE,
    TTFT_BAD_S,
)
from tui.format import duration, number, pct, plural, span

# the causes a finding can name
TTFT = "ttft"  # why the time to first token is high
KV = "kv"  # the KV cache as the limit
ITL = "itl"  # why inter-token latency is high
PREEMPTIONS = "preemptions"  # why sequences are being preempted
MACHINE = "machine"  # the machine itself (other work on it) as the limit

NONE: frozenset[str] = frozenset()


class Finding(NamedTuple):
    level: str
    headline: str
    details: list[str]
    explains: frozenset[str] = NONE  # the causes this finding names
    defers_to: frozenset[str] = NONE  # left out when an earlier reported finding names one


def reported(findings: list[Finding]) -> list[Finding]:
    """The findings (in the table's order) that no earlier reported finding has explained."""
    explained: frozenset[str] = NONE
    kept = []
    for f in findings:
        if not f.defers_to & explained:
            kept.append(f)
            explained |= f.explains
    return kept


# --- words shared by the rules -----------------------------------------------------------------


def _when(seconds: float) -> str:
    return span(seconds, COUNTER_WINDOW_S)


def _ttft_word(c: Signals) -> str:
    return "TTFT rising" if c.ttft_rising else "TTFT high"


def _ttft_level(c: Signals) -> str:
    worst = max(c.ttft_p50 or 0.0, c.max_wait if c.waiting else 0.0)
    return "bad" if worst >= TTFT_BAD_S else "warn"


def _trend_line(c: Signals, name: str, then: float | None, now: float | None) -> list[str]:
    if c.ref is None or then is None or now is None:
        return []
    return [f"{name} p50 {duration(then)} → {duration(now)} over the last {c.trend_s:.0f} s"]


def _ttft_lines(c: Signals) -> list[str]:
    """The TTFT trend and how much of TTFT the queue takes."""
    lines = _trend_line(c, "TTFT", c.ttft_then, c.ttft_p50)
    if c.queue_share is not None:
        lines.append(
            f"queue time is {pct(c.queue_share)} of TTFT "
            f"(mean {duration(c.queue_mean)} of {duration(c.ttft_mean)})"
        )
    if c.waiting:
        lines.append(f"{c.waiting} waiting, the oldest for {duration(c.max_wait)}")
    return lines


def cached_words(c: Signals) -> str:
    """A clause for KV lines: the cached cells they leave out, when there are any."""
    if not c.kv_cached:
        return ""
    return f"; {c.kv_cached:,} more hold cached prefixes, evicted on demand"


def lost_cells(c: Signals, who: str, verb: str) -> str:
    """What becomes of preempted sequences: recomputed, or, while host memory keeps copies of
    their cells (the prefix cache's host tier), restored from there."""
    if c.host_keeps:
        return f"{who} lost {verb} cells; host memory keeps a copy to restore, not recompute"
    return f"{who} lost {verb} cells and {'recompute' if verb == 'their' else 'recomputes'}"


# --- the rules, in the table's order -----------------------------------------------------------


def engine_down(c: Signals) -> Finding | None:
    if not c.engine_problem:
        return None
    if c.workers_down:  # the cause a person can act on: which worker, in few words
        names = ", ".join(
            f"{w.endpoint} {w.detail.split(' (')[0]}".rstrip() for w in c.workers_down
        )
        line = f"engine down: RPC worker {names}"
    else:
        line = f"engine down: {c.engine_problem.split('; ')[0]}"
    if len(line) + 45 <= HEADLINE_MAX:
        line += " — new chats are refused until it is back"
    details = [c.engine_problem, "new chats are refused (error `unavailable`) until it is back"]
    details += [
        f"RPC worker {w.endpoint} down" + (f": {w.detail}" if w.detail else "")
        for w in c.workers_down
    ]
    # nothing runs or is admitted while it is down: the queue's TTFT is this finding's symptom
    return Finding("bad", line, details, explains=frozenset({TTFT}))


def admission_blocked(c: Signals) -> Finding | None:
    if not (c.waiting > 0 and c.running == 0) or c.stall_s < ADMISSION_STALL_S:
        return None
    head = c.head
    lead = f"admission blocked for {duration(c.stall_s)}: {c.waiting:,} waiting, 0 running"
    details = [f"the oldest waiting request has waited {duration(c.max_wait)}"]
    if c.head_too_big and head is not None:
        why = f"next prompt needs {head.prompt_tokens:,} KV cells, {c.kv_free:,} free"
    elif c.free_ids <= 0:
        why = "no free sequence id"
        details.append("every sequence id is taken although nothing runs: ids are not released")
    else:
        why = "the scheduler admits nothing"
    if c.kv_live > 0:
        details.append(f"{c.kv_live:,} KV cells stay committed although nothing runs")
    details.append(f"KV {c.kv_live:,} of {c.kv_total:,} cells committed" + cached_words(c))
    # the queue's TTFT is this finding's symptom
    return Finding("bad", f"{lead} — {why}", details, explains=frozenset({TTFT}))


def rejecting(c: Signals) -> Finding | None:
    if c.rejections <= 0:
        return None
    n, when = c.rejections, _when(c.reject_span)
    if c.waiting > 0:
        head = f"turning requests away: {n:,} rejected {when}, {c.waiting:,} queued"
        head += " — the queue bound is reached"
    else:
        head = f"turning requests away: {n:,} rejected {when} — per-user limits or long prompts"
    details = [
        "rejections count busy refusals (queue full, per-user caps), prompts longer than the "
        "context and refusals while shutting down"
    ]
    return Finding("bad", head, details)


def machine_busy(c: Signals) -> Finding | None:
    """Other work on the machine slows every step: its load average and the steps' times
    against this machine's own best for their size, not the server's load, say so."""
    if not c.active:
        return None
    host, ratio = c.host, c.slowdown
    busy = host is not None and host.others >= OTHERS_CORES_SHARE * max(host.cpus, 1)
    slow = ratio is not None and ratio >= SLOWDOWN_HIGH
    if not ((busy and slow) or (ratio is not None and ratio >= SLOWDOWN_ALONE)):
        return None  # a busy machine that does not slow the steps is not this server's limit
    parts, details = [], []
    if busy and host is not None:
        parts.append(f"load {host.load_1m:.1f} on {host.cpus} cores")
        details.append(
            f"load average {host.load_1m:.1f} on {host.cpus} cores: this engine keeps "
            f"{host.own_cores:.1f} busy, other processes {host.others:.1f}"
        )
    if ratio is not None:
        parts.append(f"steps {ratio:.1f}× their best")
        details.append(
            f"the recent steps take {ratio:.1f}× the fastest step of their size in the last ten "
            "minutes (median of the last 32): the same work ran faster before"
        )
    if not busy:
        details.append("no other load on the cores: a throttled or shared GPU, or a slower clock")
    details.append(
        "not the server's load: find what else runs (top, nvidia-smi) or give the server its "
        "own cores"
    )
    level = "bad" if ratio is not None and ratio >= SLOWDOWN_BAD else "warn"
    line = "the machine is the limit: " + ", ".join(parts)
    return Finding(level, line, details, explains=frozenset({MACHINE, ITL, TTFT}))


def one_user_holds(c: Signals) -> Finding | None:
    """One person (a forwarded one is a person too) holds most of the running sequences, the
    live cells or the queue, while others wait: who, with the numbers."""
    if len(c.holdings) < 2:
        return None
    top, parts = next(((h, p) for h in c.holdings if (p := _held_parts(c, h))), (None, []))
    if top is None:
        return None
    others = [u for u in c.waiting_users if u != top.user]
    if not (others or top.waiting >= HOLDER_MIN_SEQS):
        return None
    line = f"{top.user} holds " + " and ".join(parts)
    line += f"; {plural(len(others), 'other')} wait" if others else ""
    details = [
        f"{top.user}: {top.running} running of {c.now.max_num_seqs} slots, "
        f"{top.cells:,} of {c.kv_live:,} live KV cells, {top.waiting} waiting"
    ]
    for h in [h for h in c.holdings if h is not top][:3]:
        waits = f", waiting up to {duration(h.longest_wait)}" if h.waiting else ""
        details.append(f"{h.user}: {h.running} running, {h.waiting} waiting{waits}")
    if len(c.holdings) > 4:
        details.append(f"and {plural(len(c.holdings) - 4, 'more user')}")
    details.append(
        "the scheduler takes users round-robin, each up to its per-user cap: lower "
        "max_running_per_user (or max_inflight_per_user) to give the others more"
    )
    level = "warn" if others else "info"
    if others and c.ttft_problem:
        level = _ttft_level(c)
    return Finding(level, line, details)


def _held_parts(c: Signals, top: Holding) -> list[str]:
    """What `top` holds clearly more than their fair share of: the slots, the live cells, the
    queue (as words)."""
    parts = []
    running = _holder_bar(len(c.holdings), c.running)  # the people running or waiting
    if top.running >= HOLDER_MIN_SEQS and top.running >= running * max(c.running, 1):
        parts.append(f"{top.running} of {c.now.max_num_seqs} slots")
    if top.running and c.kv_live and top.cells >= running * c.kv_live:
        parts.append(f"{pct(top.cells / c.kv_live)} of the cells")
    waiting = _holder_bar(len(c.waiting_users), c.waiting)
    if top.waiting >= HOLDER_MIN_SEQS and top.waiting >= waiting * max(c.waiting, 1):
        parts.append(f"{top.waiting} of {c.waiting} waiting requests")
    return parts


def _holder_bar(people: int, shared: int) -> float:
    """The share of `shared` things (running sequences, waiting requests) at which one of
    `people` clearly holds more than their fair part: HOLDER_SHARE, and HOLDER_FAIR_FACTOR ×
    the fair share, one person's part when each of them had as many (one at least: with more
    people than things, a thing's holder has their fair share; with one thing, nobody can hold
    more)."""
    fair = 1 / max(1, min(people, shared))
    return max(HOLDER_SHARE, HOLDER_FAIR_FACTOR * fair)


def capacity_bound(c: Signals) -> Finding | None:
    if not (c.ttft_problem and c.queue_dominates and c.waiting > 0):
        return None  # a drained queue: queue_other says so
    head_blocked = c.head_too_big and c.running > 0
    if not (c.kv_full or c.preemptions > 0 or head_blocked):
        return None
    w = _ttft_word(c)
    if c.kv_full:
        line = f"{w}: time in queue dominates and the KV cache is {pct(c.kv_share)} full"
    elif c.preemptions > 0:
        line = f"{w}: time in queue dominates and {plural(c.preemptions, 'preemption')} "
        line += _when(c.preempt_span)
    else:
        need = c.head.prompt_tokens if c.head is not None else 0
        line = f"{w}: queue dominates; the next prompt needs {need:,} KV cells, {c.kv_free:,} free"
    details = _ttft_lines(c)
    details.append(
        f"KV cache: {c.kv_live:,} of {c.kv_total:,} cells committed ({pct(c.kv_share)}), "
        f"{c.kv_live_used:,} hold computed tokens" + cached_words(c)
    )
    explains = {TTFT, KV}
    if c.preemptions > 0:
        details.append(
            f"{plural(c.preemptions, 'preemption')} {_when(c.preempt_span)}: "
            + lost_cells(c, "sequences", "their")
        )
        explains.add(PREEMPTIONS)
    if head_blocked and c.head is not None:
        details.append(f"the next waiting prompt has {c.head.prompt_tokens:,} tokens")
    details.append(
        "admission waits until a whole prompt fits in free cells; running sequences grow into "
        "the rest"
    )
    level = "bad" if c.preemptions > 0 else _ttft_level(c)
    return Finding(level, line + " — capacity bound", details, explains=frozenset(explains))


def slot_bound(c: Signals) -> Finding | None:
    if not (c.ttft_problem and c.queue_dominates and c.waiting > 0):
        return None  # a drained queue: queue_other says so
    s = c.now
    if s.max_num_seqs > 0 and c.running >= s.max_num_seqs:
        slots = f"all {s.max_num_seqs} sequence slots are busy"
    elif c.free_ids <= 0 and c.running > 0:
        slots = f"all {c.running} sequence ids are in use"
    else:
        return None
    details = _ttft_lines(c)
    if c.kv_share is not None:
        details.append(f"the KV cache has room: {pct(c.kv_share)} committed")
    details.append("every slot is taken; a newcomer waits for a running sequence to finish")
    line = f"{_ttft_word(c)}: time in queue dominates and {slots} — slot bound"
    return _ttft_finding(c, line, details)


def queue_other(c: Signals) -> Finding | None:
    if not (c.ttft_problem and c.queue_dominates):
        return None
    s, w = c.now, _ttft_word(c)
    details = _ttft_lines(c)
    if c.waiting == 0:
        line = f"{w}: time in queue dominated the last minute; the queue has drained"
        return _ttft_finding(c, line, details, level="info")
    if s.policy == "static" and c.running > 0:
        line = f"{w}: time in queue dominates — the static policy holds {c.waiting:,} "
        line += "until the batch drains"
        details.append("static batching admits only when every running sequence has finished")
        return _ttft_finding(c, line, details)
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
    return _ttft_finding(c, line, details)


def prefill_bound(c: Signals) -> Finding | None:
    if not c.ttft_problem or c.queue_dominates:
        return None
    s = c.now
    # a prompt's tokens reused from the cells or restored from a tier are not prefill work
    prefill_rows = [r for r in s.seqs if r.phase == "prefill"]
    longest = max(prefill_rows, key=prefill_work, default=None)
    long_prompt = longest is not None and prefill_work(longest) >= LONG_PROMPT_TOKENS
    share_high = c.prefill_share is not None and c.prefill_share >= PREFILL_BOUND_SHARE
    if not (share_high or long_prompt):
        return None
    details = _ttft_lines(c)
    st = s.steps
    if c.prefill_share is not None:
        details.append(
            f"prefill takes {pct(c.prefill_share)} of step time "
            f"({number(st.prefill_tokens)} prefill and {number(st.decode_tokens)} decode tokens "
            f"per step)"
        )
    if longest is not None:
        left = max(0, longest.prompt_tokens - longest.computed_tokens)
        reused = longest.prompt_tokens - prefill_work(longest)
        how = "restored" if longest.restored_from else "reused"
        details.append(
            f"{plural(len(prefill_rows), 'prompt')} prefilling, the longest "
            f"{longest.prompt_tokens:,} tokens ("
            + (f"{reused:,} {how}, not prefilled; " if reused else "")
            + f"{left:,} left)"
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
    if share_high or not (capped and longest is not None):
        line = f"{_ttft_word(c)}: long prompts dominate the steps — prefill bound"
    else:
        line = (
            f"{_ttft_word(c)}: long prompts advance {st.prefill_budget:,} tokens a step beside "
            f"{plural(c.decoding, 'decoder')} — prefill bound"
        )
    return _ttft_finding(c, line, details)


def ttft_other(c: Signals) -> Finding | None:
    if not c.ttft_problem:
        return None
    parts = []
    if c.queue_share is not None:
        parts.append(f"queue {pct(c.queue_share)} of it")
    if c.prefill_share is not None:
        parts.append(f"prefill {pct(c.prefill_share)} of steps")
    why = f" ({', '.join(parts)})" if parts else ""
    if not c.ttft_pending:  # its cause has left: what the window still holds is history
        line = f"{_ttft_word(c)} over the last minute (p50 {duration(c.ttft_p50)}); "
        line += "no request waits for its first token now"
        details = _ttft_lines(c) + ["nothing waits or prefills: the slow first tokens are behind"]
        return _ttft_finding(c, line, details, level="info")
    line = f"{_ttft_word(c)}: p50 {duration(c.ttft_p50)}, no single cause{why}"
    return _ttft_finding(c, line, _ttft_lines(c))


def _ttft_finding(c: Signals, line: str, details: list[str], level: str = "") -> Finding:
    """A finding about TTFT's cause: one per diagnosis, the first that applies."""
    ttft = frozenset({TTFT})
    defers = frozenset({TTFT, MACHINE})
    return Finding(level or _ttft_level(c), line, details, explains=ttft, defers_to=defers)


def itl(c: Signals) -> Finding | None:
    target = c.target
    if not c.active or target is None:
        return None
    p50_over = c.itl_p50 is not None and c.itl_p50 > target
    p90_over = c.itl_p90 is not None and c.itl_p90 > target
    if not (p50_over or p90_over):
        return None
    shown = c.itl_p50 if p50_over else c.itl_p90
    which = "p50" if p50_over else "p90"
    details = _trend_line(c, "ITL", c.itl_then, c.itl_p50)
    details.append(f"ITL {which} {duration(shown)} against a {duration(target)} target")
    causes = _itl_causes(c, target, details)
    if c.preemptions > 0:
        redo = "wait to be restored" if c.host_keeps else "recompute"
        details.append(
            f"{plural(c.preemptions, 'preemption')} {_when(c.preempt_span)}: preempted sequences "
            f"pause while they {redo}"
        )
    explains = frozenset({ITL})
    if not causes:
        if c.step_s is not None and c.step_s < DECODE_STEP_OF_TARGET * target:
            # the window still holds slow gaps, but today's steps are fast: it has passed
            line = f"ITL easing: {which} {duration(shown)} over the last minute, "
            line += f"steps now take {duration(c.step_s)}"
            details.append("the slow gaps (a long prefill, preemptions) are behind; steps are fast")
            return Finding("info", line, details, explains=explains)
        causes.append(f"steps average {duration(c.step_s)} with {c.decoding} decoding")
    word = "ITL rising" if c.itl_rising else "ITL high"
    line = f"{word}: " + "; ".join(causes[:2])
    details += [f"also: {cause}" for cause in causes[2:]]
    bad = c.itl_p50 is not None and c.itl_p50 >= ITL_BAD_FACTOR * target
    level = "bad" if bad else "warn"
    return Finding(level, line, details, explains=explains, defers_to=frozenset({MACHINE}))


def _itl_causes(c: Signals, target: float, details: list[str]) -> list[str]:
    """Why ITL is over the target, most telling first; the numbers go to `details`."""
    causes: list[str] = []
    dstep = c.decode_step_s
    if c.decoding >= 2 and (dstep is None or dstep >= DECODE_STEP_OF_TARGET * target):
        causes.append(f"{c.decoding} sequences decode at once")
        if dstep is not None:
            details.append(f"the decode part of a step takes {duration(dstep)}")
    elif c.decoding <= 1 and dstep is not None and dstep >= DECODE_STEP_OF_TARGET * target:
        causes.append(f"a lone decode step takes {duration(dstep)}")
        details.append("the model is slower than the ITL target with a single decoder")
    if c.stretched_share >= STRETCHED_SHARE:  # the prompts' chunks are the TTFT target's
        ttft = f"the {duration(c.ttft_target)} " if c.ttft_target else "the "
        causes.append(ttft + "TTFT target stretches the steps for first tokens")
        details.append(
            f"{pct(c.stretched_share)} of the recent steps' time went to steps with more prompt "
            f"tokens than the {duration(target)} ITL target allows, so that prompts get their "
            "first token in time"
        )
        details.append(
            "raise scheduler.ttft_target_ms to keep streams smooth, or lower it to favour first "
            "tokens"
        )
    elif c.prefill_share is not None and c.prefill_share >= ITL_PREFILL_SHARE:
        st = c.now.steps
        causes.append(f"prefill chunks take {pct(c.prefill_share)} of each step")
        details.append(
            f"prefill budget {st.prefill_budget:,} tokens per step "
            f"({number(st.prefill_tokens)} used on average)"
        )
    if c.engine_share is not None and c.engine_share >= ENGINE_SHARE_HIGH:
        causes.append(f"engine overhead takes {pct(c.engine_share)} of each step")
        details.append("time outside llama_decode: scheduling, batch filling, sampling, metrics")
    return causes


def preempting(c: Signals) -> Finding | None:
    if c.preemptions <= 0:
        return None
    line = (
        f"preempting: {plural(c.preemptions, 'preemption')} {_when(c.preempt_span)} "
        "— capacity bound"
    )
    details = [
        "decode growth ran out of KV cells; " + lost_cells(c, "the newest sequence", "its"),
        f"KV {pct(c.kv_share)} committed",
    ]
    return Finding(
        "warn", line, details, explains=frozenset({KV}), defers_to=frozenset({PREEMPTIONS})
    )


def kv_full(c: Signals) -> Finding | None:
    if not c.kv_full:
        return None
    line = f"KV cache {pct(c.kv_share)} committed: new prompts will wait for cells"
    free = f"{c.kv_free:,} cells free of {c.kv_total:,}"
    if c.kv_cached:
        free += f" ({c.kv_cached:,} of them hold cached prefixes, evicted on demand"
        free += "; host memory keeps copies to restore)" if c.host_keeps else ")"
    return Finding("info", line, [free], defers_to=frozenset({KV}))


def itl_rising(c: Signals) -> Finding | None:
    if not (c.active and c.itl_rising):
        return None
    line = f"ITL rising: p50 {duration(c.itl_then)} → {duration(c.itl_p50)}"
    if c.target is not None:
        line += f", still under the {duration(c.target)} target"
    return Finding("info", line, [f"{c.decoding} decoding now"], defers_to=frozenset({ITL}))


def idle(c: Signals) -> Finding | None:
    s = c.now
    if c.active or s.generation_tokens_per_s > 0 or s.prompt_tokens_per_s > 0:
        return None
    details = []
    if s.events:
        last = s.events[-1]
        details.append(f"last activity {duration(max(0.0, s.uptime_s - last.t))} ago ({last.kind})")
    if c.ttft_p50 is not None:
        details.append(f"over the last minute TTFT p50 was {duration(c.ttft_p50)}")
    where = {"CPU": "the CPU", "GPU": "the GPU"}.get(c.runs_on, "the model's devices")
    details.append(f"the scheduler has nothing to give {where}")
    verb = "are" if c.runs_on == "devices" else "is"
    return Finding("info", f"{where} {verb} idle: no eligible work", details)


def models_waiting(models: Sequence[ModelStatus]) -> Finding | None:
    """Requests wait for a model to load, or for memory to load it in (the stats frame's
    models: serve/pool.py); a model that failed to load, said with its reason."""
    details, level, headline = [], "", ""
    for m in models:
        if m.state == "loading" and m.reason.startswith("waiting for memory"):
            why = m.reason.removeprefix("waiting for memory: ")
            line = f"{_requests(m.waiting)} wait for memory to load {m.name}: {why}"
            level, headline = "warn", headline or line
        elif m.state == "loading":
            line = f"{_requests(m.waiting)} wait for model {m.name} to load"
            level, headline = level or "info", headline or line
        elif m.state == "failed":
            line = f"model {m.name} could not be loaded: {m.reason}"
            level, headline = level or "warn", headline or line
        else:
            continue
        details.append(line)
    if not details:
        return None
    return Finding(level, headline, details[1:])


def _requests(n: int) -> str:
    return "1 request" if n == 1 else f"{n} requests"


RULES = (  # the table's order: among findings of one level the first takes the headline
    engine_down,
    admission_blocked,
    rejecting,
    machine_busy,
    one_user_holds,
    capacity_bound,
    slot_bound,
    queue_other,
    prefill_bound,
    ttft_other,
    itl,
    preempting,
    kv_full,
    itl_rising,
    idle,
)
