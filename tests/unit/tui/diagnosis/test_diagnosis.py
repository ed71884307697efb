"""The monitor's plain-words diagnosis (tui/diagnosis/) on synthetic snapshots."""

from __future__ import annotations

import subprocess
import sys
from collections import deque
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localserve.protocol.snapshot import (
    Counters,
    Device,
    EventRow,
    HostLoad,
    ModelInfo,
    Percentiles,
    PrefixTier,
    SeqRow,
    Snapshot,
    StepStats,
    WaitingRow,
    Worker,
)
from tests.support.paths import ROOT
from tui.diagnosis import HEADLINE_MAX, LEVELS, Diagnosis, diagnose

MODEL = ModelInfo(
    model="test-model",
    backend="CPU",
    n_ctx=8192,
    n_seq_max=16,
    n_batch=2048,
    n_vocab=32000,
    n_layer=24,
    n_gpu_layers=0,
    n_threads=8,
    chat_template="gemma",
)


# --- a factory for valid snapshots -------------------------------------------------------------


def pct(
    p50: float | None = None,
    p90: float | None = None,
    p99: float | None = None,
    mean: float | None = None,
    count: int | None = None,
) -> Percentiles:
    """A window: give p50 and the rest follow from it; nothing gives an empty window."""
    if p50 is None:
        return Percentiles(None, p90, p99, mean, count or 0)
    p90 = p50 * 1.5 if p90 is None else p90
    p99 = p90 * 1.2 if p99 is None else p99
    return Percentiles(p50, p90, p99, p50 if mean is None else mean, 20 if count is None else count)


EMPTY = pct()


def seq(
    i: int = 0,
    phase: str = "decode",
    prompt: int = 200,
    computed: int | None = None,
    user: str | None = None,
    **kw: Any,
) -> SeqRow:
    if computed is None:
        computed = prompt if phase == "decode" else prompt // 4
    fields: dict[str, Any] = dict(
        request_id=f"r{i}",
        user=user or f"user{i}",
        phase=phase,
        prompt_tokens=prompt,
        computed_tokens=computed,
        output_tokens=20 if phase == "decode" else 0,
        cells=prompt + 20,
        cached_tokens=0,
        tokens_per_s=20.0 if phase == "decode" else None,
        ttft_s=0.2 if phase == "decode" else None,
        last_itl_s=0.05 if phase == "decode" else None,
        since_last_token_s=0.01 if phase == "decode" else None,
        num_preemptions=0,
    )
    fields.update(kw)
    fields.setdefault("client_id", fields["request_id"])
    fields.setdefault("own_cells", fields["cells"])
    fields.setdefault("own_computed", fields["computed_tokens"])
    return SeqRow(**fields)


def waiter(
    i: int = 0, prompt: int = 200, waited: float = 0.5, user: str | None = None
) -> WaitingRow:
    return WaitingRow(
        position=i,
        request_id=f"w{i}",
        client_id=f"w{i}",
        user=user or f"waiter{i}",
        prompt_tokens=prompt,
        waited_s=waited,
        is_preempted=False,
    )


def snap(
    *,
    seqs: list[SeqRow] | None = None,
    waiting_seqs: list[WaitingRow] | None = None,
    steps: dict[str, Any] | None = None,
    counters: dict[str, Any] | None = None,
    **kw: Any,
) -> Snapshot:
    """A valid Snapshot of a healthy, lightly loaded server; keywords override any field."""
    if seqs is None:
        seqs = [seq(i) for i in range(kw.get("running", 3))]
    waiting_seqs = waiting_seqs or []
    step_fields: dict[str, Any] = dict(
        num_steps=1000,
        step_s=0.045,
        decode_tokens=3.0,
        prefill_tokens=10.0,
        prefill_time_share=0.05,
        engine_share=0.05,
        prefill_budget=256,
    )
    step_fields.update(steps or {})
    fields: dict[str, Any] = dict(
        uptime_s=600.0,
        model=MODEL,
        policy="continuous",
        max_num_seqs=16,
        max_num_batched_tokens=2048,
        itl_target_s=0.12,
        running=len(seqs),
        waiting=len(waiting_seqs),
        kv_used=1800,
        kv_committed=1884,  # 23% of 8192
        kv_total=8192,
        kv_cached=0,
        cached_prefixes=0,
        free_seq_ids=16 - len(seqs),
        window_s=60.0,
        ttft=pct(0.18),
        itl=pct(0.045),
        queue=pct(0.01),
        e2e=pct(5.0),
        tpot=pct(0.045),
        prompt_tokens_per_s=200.0,
        generation_tokens_per_s=60.0,
        steps=StepStats(**step_fields),
        counters=Counters(**(counters or {})),
        seqs=seqs,
        waiting_seqs=waiting_seqs,
        events=[EventRow(590.0, "admitted", "r0", "user0", "200 prompt tokens")],
        histograms={},
    )
    fields.update(kw)
    # what the engine derives, unless a test sets it
    fields.setdefault("kv_live", max(0, fields["kv_committed"] - fields["kv_cached"]))
    fields.setdefault("kv_live_used", max(0, fields["kv_used"] - fields["kv_cached"]))
    return Snapshot(**fields)


def ramp(
    before: dict[str, Any],
    after: dict[str, Any],
    span_s: float = 60.0,
    every: float = 0.5,
    t0: float = 300.0,
) -> list[Snapshot]:
    """A history, one snapshot every `every` s over `span_s` s: the first half looks like
    `before`, the second half like `after` (each a dict of `snap` keywords)."""
    n = int(span_s / every) + 1
    out = []
    for i in range(n):
        t = t0 + i * every
        fields = before if t < t0 + span_s / 2 else after
        out.append(snap(uptime_s=t, **fields))
    return out


def decoders(n: int, start: int = 0, **kw: Any) -> list[SeqRow]:
    return [seq(start + i, **kw) for i in range(n)]


def waiters(n: int, waited: float = 3.0, prompt: int = 300) -> list[WaitingRow]:
    return [waiter(i, prompt=prompt, waited=waited - 0.1 * i) for i in range(n)]


def check(d: Diagnosis) -> Diagnosis:
    """What every diagnosis must satisfy."""
    assert isinstance(d, Diagnosis)
    assert d.level in LEVELS
    assert 0 < len(d.headline) <= HEADLINE_MAX
    assert "\n" not in d.headline
    assert not d.headline.startswith("no diagnosis"), d.details  # the internal guard never fires
    assert all(isinstance(line, str) and "\n" not in line for line in d.details)
    return d


# --- one test per diagnosis --------------------------------------------------------------------


def test_capacity_bound_kv_full():
    before = dict(ttft=pct(0.3, mean=0.35), queue=pct(0.05, mean=0.05))
    after = dict(
        seqs=decoders(10),
        waiting_seqs=waiters(6),
        ttft=pct(3.0, mean=3.2),
        queue=pct(2.5, mean=2.6),
        kv_used=7500,
        kv_committed=7864,  # 96%
    )
    d = check(diagnose(ramp(before, after)))
    assert d.headline == (
        "TTFT rising: time in queue dominates and the KV cache is 96% full — capacity bound"
    )
    assert d.level == "warn"
    assert any("300 ms → 3.0 s" in line for line in d.details)
    assert any("queue time is 81% of TTFT" in line for line in d.details)


def test_capacity_bound_by_preemptions_is_bad():
    before = dict(ttft=pct(0.3), queue=pct(0.05), counters=dict(preemptions=2))
    after = dict(
        seqs=decoders(8),
        waiting_seqs=waiters(3),
        ttft=pct(2.5),
        queue=pct(2.0),
        kv_committed=6000,  # 73%: room by the numbers, but decodes ran out
        counters=dict(preemptions=7),
    )
    d = check(diagnose(ramp(before, after)))
    assert d.level == "bad"
    assert d.headline == (
        "TTFT rising: time in queue dominates and 5 preemptions in the last minute — capacity bound"
    )
    assert not any(line.startswith("also (warn): preempting") for line in d.details)


def test_a_slot_bound_warning_stops_when_the_queue_has_drained():
    """The window still says the queue dominated, every slot is still busy, but nobody waits:
    the cause has left, the finding says so at level info."""
    queued = dict(
        seqs=decoders(16),
        waiting_seqs=waiters(5),
        free_seq_ids=0,
        ttft=pct(2.4, mean=2.5),
        queue=pct(2.0, mean=2.1),
    )
    drained = dict(queued, waiting_seqs=[])
    assert check(diagnose(ramp(queued, queued))).headline.endswith("slot bound")
    d = check(diagnose(ramp(queued, drained)))
    assert d.level == "info"
    assert d.headline == "TTFT high: time in queue dominated the last minute; the queue has drained"


def test_a_ttft_warning_stops_when_the_long_prefill_behind_it_is_done():
    """A long paste prefilled (prefill bound); once it decodes, the window's p50 is still the
    slow first tokens' but nothing waits or prefills: info about the last minute, not a warning.
    A short prompt that has just started prefilling does not bring the warning back; one that
    has prefilled for a while does, and once the slow samples leave the window it is healthy."""
    paste = seq(9, phase="prefill", prompt=3000, computed=800)
    slow = dict(ttft=pct(4.0), queue=pct(0.05), steps=dict(prefill_time_share=0.2))
    prefilling = dict(slow, seqs=[*decoders(3), paste])
    decoding = dict(slow, seqs=[*decoders(3), seq(9, prompt=3000)])
    d = check(diagnose(ramp(prefilling, prefilling)))
    assert d.level == "warn" and d.headline.endswith("— prefill bound")

    d = check(diagnose(ramp(prefilling, decoding)))
    assert d.level == "info"
    assert d.headline == (
        "TTFT high over the last minute (p50 4.0 s); no request waits for its first token now"
    )

    history = ramp(prefilling, decoding)
    short = seq(10, phase="prefill", prompt=40, computed=10)
    t = history[-1].uptime_s
    history.append(snap(uptime_s=t + 0.5, **dict(decoding, seqs=[*decoders(3), short])))
    assert check(diagnose(history)).level == "info"  # seen 0 s ago
    for i in range(1, 4):
        history.append(
            snap(uptime_s=t + 0.5 + 0.5 * i, **dict(decoding, seqs=[*decoders(3), short]))
        )
    d = check(diagnose(history))  # prefilling for 1.5 s: a first token slow now
    assert (d.level, d.headline) == (
        "warn",
        "TTFT high: p50 4.0 s, no single cause (queue 1% of it, prefill 20% of steps)",
    )

    left = ramp(decoding, dict(decoding, ttft=pct(0.3)))  # the slow samples left the window
    assert check(diagnose(left)).level == "ok"


def test_capacity_bound_next_prompt_does_not_fit():
    after = dict(
        seqs=decoders(4),
        waiting_seqs=[waiter(0, prompt=5000, waited=4.0)],
        ttft=pct(3.0),
        queue=pct(2.5),
        kv_committed=6000,
    )
    d = check(diagnose(ramp(after, after)))
    assert d.headline.endswith("the next prompt needs 5,000 KV cells, 2,192 free — capacity bound")
    assert d.headline.startswith("TTFT high:")  # flat, not rising


def test_slot_bound():
    before = dict(ttft=pct(0.3), queue=pct(0.02))
    after = dict(
        seqs=decoders(16),
        waiting_seqs=waiters(5),
        free_seq_ids=0,
        ttft=pct(2.4, mean=2.5),
        queue=pct(2.0, mean=2.1),
        kv_committed=3500,
    )
    d = check(diagnose(ramp(before, after)))
    assert d.headline == (
        "TTFT rising: time in queue dominates and all 16 sequence slots are busy — slot bound"
    )
    assert d.level == "warn"
    assert any("the KV cache has room: 43% committed" in line for line in d.details)


def test_prefill_bound():
    before = dict(ttft=pct(0.4), queue=pct(0.02))
    after = dict(
        seqs=decoders(3) + [seq(3, phase="prefill", prompt=8000, computed=3000)],
        ttft=pct(2.5, mean=2.6),
        queue=pct(0.1, mean=0.1),
        steps=dict(prefill_time_share=0.8, prefill_tokens=480.0, decode_tokens=3.0),
    )
    d = check(diagnose(ramp(before, after)))
    assert d.headline == "TTFT rising: long prompts dominate the steps — prefill bound"
    assert d.level == "warn"
    assert any("prefill takes 80% of step time" in line for line in d.details)
    assert any("the longest 8,000 tokens (5,000 left)" in line for line in d.details)


def test_prefill_bound_held_back_by_the_itl_target():
    after = dict(
        seqs=decoders(12) + [seq(12, phase="prefill", prompt=6000, computed=1000)],
        ttft=pct(3.0),
        queue=pct(0.2),
        steps=dict(prefill_time_share=0.2, prefill_budget=128, decode_tokens=12.0),
    )
    d = check(diagnose(ramp(after, after)))
    assert d.headline == (
        "TTFT high: long prompts advance 128 tokens a step beside 12 decoders — prefill bound"
    )
    assert any("ITL target caps prefill at 128 tokens per step" in line for line in d.details)


def test_itl_many_decoders_and_prefill_share():
    before = dict(seqs=decoders(6), itl=pct(0.05))
    after = dict(
        seqs=decoders(14),
        itl=pct(0.25),
        steps=dict(step_s=0.3, prefill_time_share=0.6, decode_tokens=14.0),
    )
    d = check(diagnose(ramp(before, after)))
    assert d.headline == (
        "ITL rising: 14 sequences decode at once; prefill chunks take 60% of each step"
    )
    assert d.level == "bad"  # p50 250 ms >= 2 x 120 ms


def test_itl_many_decoders_only():
    after = dict(seqs=decoders(14), itl=pct(0.15), steps=dict(step_s=0.16))
    d = check(diagnose([snap(**after)]))
    assert d.headline == "ITL high: 14 sequences decode at once"
    assert d.level == "warn"


def test_itl_prefill_share_only():
    after = dict(
        seqs=decoders(2) + [seq(2, phase="prefill", prompt=600)],
        itl=pct(0.1, p90=0.2),  # p50 under the target, p90 above it
        steps=dict(step_s=0.15, prefill_time_share=0.7),
    )
    d = check(diagnose([snap(**after)]))
    assert d.headline == "ITL high: prefill chunks take 70% of each step"
    assert any("ITL p90 200 ms against a 120 ms target" in line for line in d.details)


def test_itl_easing_after_a_long_prefill_is_info():
    # the window still holds the slow gaps of a finished paste; one decoder, fast steps now
    after = dict(seqs=decoders(1), itl=pct(0.15, p90=0.23), steps=dict(step_s=0.028))
    d = check(diagnose([snap(**after)]))
    assert d.level == "info"
    assert d.headline == "ITL easing: p50 150 ms over the last minute, steps now take 28 ms"


def test_itl_rising_under_target_is_info():
    d = check(diagnose(ramp(dict(itl=pct(0.03)), dict(itl=pct(0.09, p90=0.11)))))
    assert d.level == "info"
    assert d.headline == "ITL rising: p50 30 ms → 90 ms, still under the 120 ms target"


QUIET = dict(
    seqs=[],
    prompt_tokens_per_s=0.0,
    generation_tokens_per_s=0.0,
    kv_used=0,
    kv_committed=0,
    ttft=EMPTY,
    itl=EMPTY,
    queue=EMPTY,
)
CUDA = msgspec.structs.replace(MODEL, backend="CUDA", n_gpu_layers=24)


@pytest.mark.parametrize(
    "model, headline",
    [
        (MODEL, "the CPU is idle: no eligible work"),  # a CPU build
        (msgspec.structs.replace(CUDA, n_gpu_layers=0), "the CPU is idle: no eligible work"),
        (CUDA, "the GPU is idle: no eligible work"),
        (
            msgspec.structs.replace(
                CUDA, devices=(Device("CPU", "x", 0, 0.0), Device("CUDA0", "y", 24, 9.0))
            ),
            "the GPU is idle: no eligible work",
        ),
        (
            msgspec.structs.replace(
                MODEL, devices=(Device("CPU", "x", 12, 6.0), Device("RPC0", "h:1", 12, 6.0, "h:1"))
            ),
            "the model's devices are idle: no eligible work",
        ),
    ],
    ids=["cpu-build", "cuda-build-no-offload", "gpu", "gpu-devices", "rpc-split"],
)
def test_idle_names_where_the_model_runs(model, headline):
    d = check(diagnose(ramp(dict(QUIET, model=model), dict(QUIET, model=model))))
    assert (d.level, d.headline) == ("info", headline)
    where = headline.removesuffix(" idle: no eligible work").rsplit(" ", 1)[0]  # "the CPU"
    assert f"the scheduler has nothing to give {where}" in d.details


def test_idle():
    quiet = dict(
        seqs=[],
        prompt_tokens_per_s=0.0,
        generation_tokens_per_s=0.0,
        kv_used=0,
        kv_committed=0,
        ttft=EMPTY,
        itl=EMPTY,
        queue=EMPTY,
        events=[EventRow(60.0, "finished", "r0", "user0", "stop, 20 tokens")],
    )
    d = check(diagnose(ramp(quiet, quiet)))
    assert d.headline == "the CPU is idle: no eligible work"
    assert "the scheduler has nothing to give the CPU" in d.details
    assert d.level == "info"
    assert any(line.startswith("last activity 5 min ago (finished)") for line in d.details)


def test_idle_but_queued_is_admission_blocked():
    history = ramp(
        dict(),
        dict(seqs=[], waiting_seqs=waiters(3, waited=40.0), kv_used=0),
    )
    d = check(diagnose(history))
    assert d.level == "bad"
    assert d.headline.startswith("admission blocked for 30 s: 3 waiting, 0 running")
    assert d.headline.endswith("— the scheduler admits nothing")
    assert "1,884 KV cells stay committed although nothing runs" in d.details
    assert not any("time in queue dominates" in line for line in d.details)


def test_engine_down_says_so_first():
    workers = [
        Worker("10.0.0.2:50052", True),
        Worker("10.0.0.3:50052", False, "connection refused"),
    ]
    down = dict(
        engine_problem="RPC worker 10.0.0.3:50052 is gone",
        workers=workers,
        seqs=[],
        waiting_seqs=waiters(3, waited=20.0),
        ttft=pct(8.0),
        queue=pct(7.5),
        counters=dict(rejections=5),
    )
    d = check(diagnose(ramp(dict(), down)))
    assert d.level == "bad"
    # the worker that is down, in few words; the whole problem first in the details
    assert d.headline == "engine down: RPC worker 10.0.0.3:50052 connection refused"
    assert d.details[:3] == [
        "RPC worker 10.0.0.3:50052 is gone",
        "new chats are refused (error `unavailable`) until it is back",
        "RPC worker 10.0.0.3:50052 down: connection refused",
    ]
    # what follows from it comes after, the queue's TTFT not at all
    also = [line for line in d.details if line.startswith("also")]
    assert also[0].startswith("also (bad): admission blocked") and "TTFT" not in " ".join(also)


def test_engine_down_with_a_long_reason_keeps_the_reason_in_the_headline():
    why = "restarting the engine after it exited with SIGABRT (llama.cpp's RPC client, worker gone)"
    d = check(diagnose([snap(engine_problem=why)]))
    assert d.level == "bad" and d.headline.startswith("engine down: restarting the engine after")
    assert d.details[:2] == [why, "new chats are refused (error `unavailable`) until it is back"]


def test_a_serving_engine_says_nothing_of_its_workers():
    d = check(diagnose([snap(workers=[Worker("10.0.0.2:50052", True)])]))
    assert d.level == "ok"


def test_admission_blocked_by_a_prompt_that_does_not_fit():
    blocked = dict(
        seqs=[], waiting_seqs=[waiter(0, prompt=3000, waited=9.0)], kv_committed=6000, kv_used=0
    )
    d = check(diagnose([snap(**blocked)]))  # one look: the oldest wait is the clock
    assert d.headline == (
        "admission blocked for 9.0 s: 1 waiting, 0 running — "
        "next prompt needs 3,000 KV cells, 2,192 free"
    )


def test_queued_for_a_moment_is_not_blocked():
    """The monitor may look between an arrival and the next step."""
    history = ramp(dict(), dict())
    history.append(snap(uptime_s=361.0, seqs=[], waiting_seqs=[waiter(0, waited=0.1)]))
    d = check(diagnose(history))
    assert not d.headline.startswith("admission blocked")


def test_rejections():
    before = dict(counters=dict(rejections=3))
    after = dict(
        seqs=decoders(16),
        waiting_seqs=waiters(40, waited=1.0),
        counters=dict(rejections=15),
    )
    d = check(diagnose(ramp(before, after)))
    assert d.level == "bad"
    assert d.headline == (
        "turning requests away: 12 rejected in the last minute, 40 queued — "
        "the queue bound is reached"
    )


def test_rejections_in_a_short_history_say_their_span():
    history = ramp(dict(counters=dict(rejections=0)), dict(counters=dict(rejections=2)), span_s=20)
    d = check(diagnose(history))
    assert d.headline.startswith("turning requests away: 2 rejected in the last 20 s")
    assert d.headline.endswith("per-user limits or long prompts")


def test_healthy():
    d = check(diagnose(ramp(dict(), dict())))
    assert d == Diagnosis(
        "ok", "healthy: 3 streaming, TTFT p50 180 ms, ITL p50 45 ms, KV 23%", d.details
    )
    assert any(line.startswith("now: 3 running") for line in d.details)


def test_static_policy_queue():
    after = dict(
        policy="static",
        seqs=decoders(4),
        waiting_seqs=waiters(4, waited=5.0),
        ttft=pct(4.0),
        queue=pct(3.5),
    )
    d = check(diagnose([snap(**after)]))
    assert d.headline == (
        "TTFT high: time in queue dominates — the static policy holds 4 until the batch drains"
    )


# --- severity and combinations -----------------------------------------------------------------


def test_most_severe_leads_and_the_rest_follow():
    before = dict(ttft=pct(0.3), queue=pct(0.05), counters=dict(rejections=0))
    after = dict(
        seqs=decoders(10),
        waiting_seqs=waiters(6),
        ttft=pct(3.0),
        queue=pct(2.5),
        kv_committed=7864,
        itl=pct(0.15),
        steps=dict(step_s=0.16),
        counters=dict(rejections=4),
    )
    d = check(diagnose(ramp(before, after)))
    assert d.level == "bad"
    assert d.headline.startswith("turning requests away: 4 rejected")
    also = [line for line in d.details if line.startswith("also")]
    assert also[0].startswith("also (warn): TTFT rising: time in queue dominates")
    assert also[1] == "also (warn): ITL rising: 10 sequences decode at once"


def test_kv_nearly_full_without_symptoms_is_info():
    d = check(diagnose([snap(kv_committed=7700)]))
    assert d.level == "info"
    assert d.headline == "KV cache 94% committed: new prompts will wait for cells"


# --- prefix caching ----------------------------------------------------------------------------


def test_a_cache_full_of_cached_prefixes_is_not_pressure():
    # 97% committed, but 6,100 of those cells only hold finished conversations: evictable
    cached = dict(kv_used=7900, kv_committed=7984, kv_cached=6100, cached_prefixes=12)
    d = check(diagnose(ramp(cached, cached)))
    assert d == Diagnosis(
        "ok", "healthy: 3 streaming, TTFT p50 180 ms, ITL p50 45 ms, KV 23%", d.details
    )
    assert any(
        line.startswith("KV 23% committed (1,884 of 8,192 cells, 1,800 used)") for line in d.details
    )
    # a queue that builds up is not blamed on the cache either
    queued = dict(cached, waiting_seqs=waiters(4, prompt=3000), ttft=pct(3.0), queue=pct(2.5))
    d = check(diagnose([snap(**queued)]))
    assert d.headline == "TTFT high: time in queue dominates although slots and KV are free"


def test_live_pressure_beside_cached_prefixes_is_still_capacity_bound():
    after = dict(
        seqs=decoders(10),
        waiting_seqs=waiters(6),
        ttft=pct(3.0),
        queue=pct(2.5),
        kv_used=7900,
        kv_committed=8000,
        kv_cached=200,  # 7,800 live: 95%
        cached_prefixes=2,
    )
    d = check(diagnose([snap(**after)]))
    assert d.headline == (
        "TTFT high: time in queue dominates and the KV cache is 95% full — capacity bound"
    )
    assert any(
        line.startswith("KV cache: 7,800 of 8,192 cells committed (95%), 7,700 hold computed")
        and line.endswith("; 200 more hold cached prefixes, evicted on demand")
        for line in d.details
    )


def test_cached_cells_do_not_block_admission():
    # nothing runs, every committed cell is a cached prefix and they hold every free id:
    # the engine evicts them for the prompt, so a stall is not explained by them
    blocked = dict(
        seqs=[],
        waiting_seqs=[waiter(0, prompt=3000, waited=9.0)],
        kv_used=6000,
        kv_committed=6000,
        kv_cached=6000,
        cached_prefixes=16,
        free_seq_ids=0,
    )
    d = check(diagnose([snap(**blocked)]))
    assert d.headline == (
        "admission blocked for 9.0 s: 1 waiting, 0 running — the scheduler admits nothing"
    )
    assert not any("stay committed although nothing runs" in line for line in d.details)
    live = dict(blocked, kv_committed=6500)  # 500 cells promised with nothing running
    d = check(diagnose([snap(**live)]))
    assert "500 KV cells stay committed although nothing runs" in d.details


def test_cached_prefixes_hold_ids_but_the_slots_are_not_busy():
    after = dict(
        seqs=decoders(4),
        waiting_seqs=waiters(3),
        ttft=pct(3.0),
        queue=pct(2.5),
        free_seq_ids=0,  # the other ids hold cached prefixes, evicted for newcomers
        cached_prefixes=12,
    )
    d = check(diagnose([snap(**after)]))
    assert "slot bound" not in d.headline


def test_prefix_reuse_is_reported_in_the_details():
    before = dict(counters=dict(prompt_tokens=1000, cached_tokens=0, prefix_hits=2))
    after = dict(
        kv_used=3034,
        kv_committed=3118,
        kv_cached=1234,
        cached_prefixes=5,
        counters=dict(prompt_tokens=5000, cached_tokens=2560, prefix_hits=19, prefix_evictions=3),
    )
    d = check(diagnose(ramp(before, after)))
    assert d.level == "ok" and d.headline.endswith("KV 23%")  # good news, not a finding
    assert d.details[-1] == (
        "prefix cache: 64% of prompt tokens reused in the last minute (17 hits); "
        "1,234 cells cached in 5 prefixes; 3 prefixes evicted to make room"
    )
    d = check(diagnose([snap(kv_cached=100, cached_prefixes=1, uptime_s=30.0)]))
    assert d.details[-1] == "prefix cache: 100 cells cached in 1 prefix, no reuse in the last 30 s"
    d = check(diagnose([snap()]))  # no prefix cache in use: no line
    assert not any(line.startswith("prefix cache") for line in d.details)


# --- the prefix cache's tiers -----------------------------------------------------------------

MIB = 1 << 20
HOST = PrefixTier(True, "", entries=12, bytes=340 * MIB, budget_bytes=4096 * MIB)


def test_tokens_restored_from_a_tier_are_not_prefill_work():
    """A long prompt whose prefix came back from host memory prefills only its tail: it does not
    make the steps prefill-bound; one that must still prefill most of its tokens does."""
    slow = dict(ttft=pct(2.5, mean=2.6), queue=pct(0.1, mean=0.1), host_tier=HOST)
    steps = dict(prefill_time_share=0.1, prefill_tokens=20.0, decode_tokens=3.0)
    restored = seq(3, phase="prefill", prompt=8000, computed=7990, cached_tokens=7990,
                   restored_tokens=7990, restored_from="host")  # fmt: skip
    d = check(diagnose([snap(seqs=decoders(3) + [restored], steps=steps, **slow)]))
    assert d.headline.startswith("TTFT high") and "prefill bound" not in d.headline
    prefilled = msgspec.structs.replace(
        restored, computed_tokens=0, cached_tokens=0, restored_tokens=0, restored_from=""
    )
    d = check(diagnose([snap(seqs=decoders(3) + [prefilled], steps=steps, **slow)]))
    assert d.headline.endswith("prefill bound")
    partly = msgspec.structs.replace(
        restored, computed_tokens=3000, cached_tokens=3000, restored_tokens=3000
    )
    d = check(diagnose([snap(seqs=decoders(3) + [partly], steps=steps, **slow)]))
    assert d.headline.endswith("prefill bound")
    assert any(
        "the longest 8,000 tokens (3,000 restored, not prefilled; 5,000 left)" in line
        for line in d.details
    )


def test_preempted_sequences_are_restored_not_recomputed_while_host_memory_keeps_them():
    before = dict(counters=dict(preemptions=0))
    after = dict(kv_committed=7000, counters=dict(preemptions=4))
    d = check(diagnose(ramp(before, after)))
    assert d.headline.startswith("preempting") and "recomputes" in d.details[0]
    d = check(diagnose(ramp(dict(before, host_tier=HOST), dict(after, host_tier=HOST))))
    assert d.headline.startswith("preempting")
    assert d.details[0] == (
        "decode growth ran out of KV cells; the newest sequence lost its cells; host memory "
        "keeps a copy to restore, not recompute"
    )
    assert "recomputes" not in " ".join(d.details)
    d = check(diagnose([snap(kv_committed=7700, kv_cached=100, host_tier=HOST)]))
    assert d.headline.startswith("KV cache 93% committed") and d.details[0] == (
        "592 cells free of 8,192 (100 of them hold cached prefixes, evicted on demand; host "
        "memory keeps copies to restore)"
    )


def test_the_tiers_and_their_restores_are_in_the_picture_of_the_moment():
    def tiers(hits: int, restored: int, disk: PrefixTier) -> dict:
        host = msgspec.structs.replace(HOST, hits=hits, restored_tokens=restored)
        return dict(host_tier=host, disk_tier=disk)

    disk = PrefixTier(True, "", entries=30, bytes=1288 * MIB, budget_bytes=16384 * MIB, hits=2)
    before = dict(counters=dict(prompt_tokens=1000, prefix_hits=2), **tiers(1, 500, disk))
    after = dict(
        kv_cached=1234,
        cached_prefixes=5,
        counters=dict(prompt_tokens=5000, cached_tokens=2560, prefix_hits=19, prefix_evictions=3),
        **tiers(6, 2500, msgspec.structs.replace(disk, hits=3, restored_tokens=400)),
    )
    d = check(diagnose(ramp(before, after)))
    assert d.level == "ok"
    assert d.details[-2] == (
        "prefix cache: 64% of prompt tokens reused in the last minute (17 hits); 1,234 cells "
        "cached in 5 prefixes; 3 prefixes evicted to make room (kept in host memory)"
    )
    assert d.details[-1] == (
        "saved prefixes: host memory 340/4,096 MiB in 12 prefixes; 6 restores gave back 2,400 "
        "tokens in the last minute (1 from disk); disk 1.3/16.0 GiB in 30 prefixes"
    )
    off = PrefixTier(problem="no room on /var")
    d = check(diagnose([snap(uptime_s=30.0, **tiers(2, 900, off))]))
    assert d.details[-1] == (
        "saved prefixes: host memory 340/4,096 MiB in 12 prefixes; 2 restores gave back 900 "
        "tokens in the last 30 s; disk off: no room on /var"
    )


# --- robustness --------------------------------------------------------------------------------


def test_empty_history():
    d = check(diagnose([]))
    assert d.level == "info"
    assert d.headline == "no stats yet"


def test_single_snapshot_has_levels_but_no_trend():
    d = check(diagnose([snap(ttft=pct(0.3))]))
    assert d.level == "ok"
    d = check(diagnose([snap(ttft=pct(3.0), queue=pct(0.1), steps=dict(prefill_time_share=0.7))]))
    assert d.headline == "TTFT high: long prompts dominate the steps — prefill bound"


def test_none_percentiles_everywhere():
    empty = dict(ttft=EMPTY, itl=EMPTY, queue=EMPTY, e2e=EMPTY, tpot=EMPTY)
    nothing = StepStats(0, None, None, None, None, None, 0)
    d = check(diagnose([snap(**empty)]))
    assert d.headline == "healthy: 3 streaming, TTFT p50 —, ITL p50 —, KV 23%"
    history = [snap(uptime_s=100.0 + i, **empty) for i in range(60)]
    history.append(msgspec.structs.replace(snap(uptime_s=161.0, **empty), steps=nothing))
    check(diagnose(history))
    # a queue with nothing measured yet still counts
    d = check(diagnose([snap(waiting_seqs=waiters(2, waited=5.0), **empty)]))
    assert "time in queue dominates" in d.headline


def test_degenerate_numbers():
    for kw in (
        dict(kv_total=0, kv_committed=0, kv_used=0),
        dict(max_num_seqs=0, itl_target_s=0.0),
        dict(running=0, seqs=[], uptime_s=0.0, counters=dict(rejections=5)),
        dict(ttft=pct(float("nan")), itl=pct(float("inf"))),
    ):
        check(diagnose([snap(**kw)]))


def test_restart_starts_the_history_afresh():
    before = ramp(dict(counters=dict(rejections=100)), dict(counters=dict(rejections=100)))
    after = [snap(uptime_s=100.0 + i, counters=dict(rejections=0)) for i in range(10)]
    d = check(diagnose(before + after))
    assert d.level == "ok"


def test_accepts_any_sequence():
    history = deque(ramp(dict(), dict()), maxlen=240)
    assert check(diagnose(history)).level == "ok"
    assert check(diagnose(tuple(history))).level == "ok"


def test_headline_never_exceeds_the_limit_with_huge_numbers():
    huge = 10**12
    after = dict(
        seqs=decoders(40),
        waiting_seqs=[waiter(0, prompt=huge, waited=1e9)],
        max_num_seqs=40,
        kv_total=huge,
        kv_committed=huge - 1,
        ttft=pct(1e9),
        queue=pct(9e8),
        itl=pct(1e6),
        counters=dict(rejections=huge, preemptions=huge),
        steps=dict(step_s=1e6, prefill_time_share=0.9, engine_share=0.9),
    )
    for history in ([snap(**after)], ramp(dict(), after)):
        d = check(diagnose(history))
        assert all(len(line) <= 200 for line in d.details)


floats = st.one_of(
    st.none(),
    st.floats(min_value=0, max_value=1e7, allow_nan=False),
    st.sampled_from([0.0, 1e-9, 0.12, 2.0, float("nan"), float("inf")]),
)
counts = st.integers(min_value=0, max_value=10**9)


def step_fields(draw: st.DrawFn) -> dict[str, Any]:
    return dict(
        step_s=draw(floats),
        decode_tokens=draw(floats),
        prefill_tokens=draw(floats),
        prefill_time_share=draw(floats),
        engine_share=draw(floats),
        prefill_budget=draw(st.integers(0, 4096)),
    )


def counter_fields(draw: st.DrawFn) -> dict[str, Any]:
    return dict(
        preemptions=draw(counts),
        rejections=draw(counts),
        steps=draw(st.integers(0, 5)),
        prompt_tokens=draw(counts),
        cached_tokens=draw(counts),
        prefix_hits=draw(counts),
        prefix_evictions=draw(counts),
    )


@st.composite
def snapshots(draw: st.DrawFn, uptime: float) -> Snapshot:
    n_run = draw(st.integers(0, 20))
    rows = [
        seq(
            i,
            phase=draw(st.sampled_from(["prefill", "decode"])),
            prompt=draw(st.integers(0, 10**6)),
            user=draw(st.sampled_from(["a", "b", "c"])),
            restored_tokens=draw(st.integers(0, 10**6)),
            restored_from=draw(st.sampled_from(["", "host", "disk"])),
        )
        for i in range(n_run)
    ]
    n_wait = draw(st.integers(0, 5))
    waits = [
        waiter(
            i,
            prompt=draw(st.integers(0, 10**6)),
            waited=draw(st.floats(0, 1e6)),
            user=draw(st.sampled_from(["a", "b", "d"])),
        )
        for i in range(n_wait)
    ]

    def window() -> Percentiles:
        return Percentiles(draw(floats), draw(floats), draw(floats), draw(floats), draw(counts))

    kv_total = draw(st.integers(0, 10**6))
    kv_used = draw(st.integers(0, kv_total + 10))
    return snap(
        uptime_s=uptime,
        policy=draw(st.sampled_from(["continuous", "static"])),
        seqs=rows,
        waiting_seqs=waits,
        running=draw(st.sampled_from([n_run, 0, 50])),
        waiting=draw(st.sampled_from([n_wait, 0, 50])),
        max_num_seqs=draw(st.integers(0, 32)),
        itl_target_s=draw(st.sampled_from([0.0, 0.05, 0.12, 1e6])),
        kv_total=kv_total,
        kv_used=kv_used,
        kv_committed=draw(st.integers(0, kv_total + 10)),
        kv_cached=draw(st.integers(0, kv_used)),
        cached_prefixes=draw(st.integers(0, 64)),
        free_seq_ids=draw(st.integers(0, 16)),
        ttft=window(),
        itl=window(),
        queue=window(),
        prompt_tokens_per_s=draw(st.floats(0, 1e6)),
        generation_tokens_per_s=draw(st.floats(0, 1e6)),
        steps=step_fields(draw),
        counters=counter_fields(draw),
        events=[],
        engine_problem=draw(st.sampled_from(["", "worker gone", "x" * 300, " \n "])),
        workers=[Worker("10.0.0.2:50052", draw(st.booleans()), draw(st.text(max_size=300)))],
        host_tier=tier(draw),
        disk_tier=tier(draw),
    )


def tier(draw: st.DrawFn) -> PrefixTier:
    return PrefixTier(
        enabled=draw(st.booleans()),
        problem=draw(st.sampled_from(["", "no room", "x" * 300])),
        entries=draw(counts),
        bytes=draw(counts),
        budget_bytes=draw(st.sampled_from([0, 1 << 20, 1 << 40])),
        hits=draw(counts),
        restored_tokens=draw(counts),
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_histories_never_break_the_rules(data: st.DataObject):
    n = data.draw(st.integers(0, 6))
    uptimes = data.draw(st.lists(st.floats(0, 1e5), min_size=n, max_size=n))
    history = [data.draw(snapshots(t)) for t in uptimes]
    check(diagnose(history))


def test_importing_does_not_pull_in_textual():
    code = "import tui.diagnosis, sys; assert 'textual' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_requests_waiting_for_a_model_to_load_or_for_memory_are_said_in_plain_words():
    from localserve.protocol.frames import ModelStatus

    history = ramp({}, {})
    loading = [ModelStatus("gemma", "loaded"), ModelStatus("small", "loading", waiting=2)]
    d = check(diagnose(history, loading))
    assert d.level == "info" and d.headline == "2 requests wait for model small to load"
    memory = [
        ModelStatus("gemma", "loaded", busy=True),
        ModelStatus("small", "loading", reason="waiting for memory: gemma is busy", waiting=1),
    ]
    d = check(diagnose(history, memory))
    assert d.level == "warn"
    assert d.headline == "1 request wait for memory to load small: gemma is busy"
    failed = [ModelStatus("gemma", "loaded"), ModelStatus("x", "failed", reason="no such file")]
    assert check(diagnose(history, failed)).headline == "model x could not be loaded: no such file"
    assert diagnose(history, [ModelStatus("gemma", "loaded")]) == diagnose(history)


# --- who holds the server (issue 40) -----------------------------------------------------------


def held_by(users: list[str], cells: int = 300) -> list[SeqRow]:
    return [seq(i, user=u, cells=cells) for i, u in enumerate(users)]


def waiting_for(users: list[str], waited: float = 4.0) -> list[WaitingRow]:
    return [waiter(i, user=u, waited=waited) for i, u in enumerate(users)]


def test_one_user_holding_most_slots_and_cells_is_named():
    running = held_by(["alice"] * 9 + ["bob", "carol"])
    after = dict(
        seqs=running,
        waiting_seqs=waiting_for(["dave", "erin", "frank"]),
        kv_committed=4000,
        ttft=pct(3.0, mean=3.1),
        queue=pct(2.5, mean=2.6),
    )
    d = check(diagnose([snap(**after)]))
    assert d.headline == "alice holds 9 of 16 slots and 68% of the cells; 3 others wait"
    assert d.level == "warn"
    assert any(
        line.startswith("alice: 9 running of 16 slots, 2,700 of 4,000") for line in d.details
    )
    assert any("dave: 0 running, 1 waiting, waiting up to 4.0 s" in line for line in d.details)


def test_a_balanced_server_names_nobody():
    running = held_by(["alice", "bob", "carol", "dave"] * 4)
    after = dict(
        seqs=running,
        waiting_seqs=waiting_for(["erin", "frank"]),
        free_seq_ids=0,
        kv_committed=5000,
        ttft=pct(3.0, mean=3.1),
        queue=pct(2.5, mean=2.6),
    )
    d = check(diagnose([snap(**after)]))
    assert d.headline.endswith("slot bound")
    assert not any(" holds " in line for line in [d.headline, *d.details])


def test_one_users_queue_is_named_when_it_is_most_of_the_queue():
    after = dict(
        seqs=held_by(["bob", "carol"]),
        waiting_seqs=waiting_for(["mallory"] * 6 + ["dave"]),
    )
    d = check(diagnose([snap(**after)]))
    assert any(
        line.startswith("mallory holds 6 of 7 waiting requests; 1 other wait")
        for line in [d.headline, *(x.removeprefix("also (warn): ") for x in d.details)]
    )


def test_the_ttft_target_is_named_when_it_stretches_the_steps():
    stretched = dict(
        seqs=decoders(3)
        + [seq(3, phase="prefill", prompt=3000), seq(4, phase="prefill", prompt=3000)],
        itl=pct(0.2),
        steps=dict(step_s=0.22, prefill_time_share=0.6, stretched_share=0.8),
        ttft_target_s=5.0,
    )
    d = check(diagnose([snap(**stretched)]))
    assert d.headline == "ITL high: the 5.0 s TTFT target stretches the steps for first tokens"
    assert not any("prefill chunks take" in line for line in d.details)
    assert any(
        "80% of the recent steps' time went to steps with more" in line for line in d.details
    )
    # the same steps without the stretch: prefill pressure, as before
    d = check(diagnose([snap(**dict(stretched, steps=dict(step_s=0.22, prefill_time_share=0.6)))]))
    assert d.headline == "ITL high: prefill chunks take 60% of each step"


# --- the machine as the limit (issue 40) -------------------------------------------------------


def test_other_work_on_the_cores_is_named_instead_of_the_load():
    load = dict(
        seqs=decoders(3) + [seq(3, phase="prefill", prompt=3000)],
        itl=pct(0.3),
        ttft=pct(4.0),
        steps=dict(step_s=0.3, prefill_time_share=0.6, slowdown=2.3),
    )
    busy = dict(load, host=HostLoad(cpus=2, load_1m=10.5, own_cores=1.9))
    d = check(diagnose([snap(**busy)]))
    assert d.headline == "the machine is the limit: load 10.5 on 2 cores, steps 2.3× their best"
    assert not any("prefill bound" in line or "ITL high" in line for line in d.details)
    assert any("load average 10.5 on 2 cores" in line for line in d.details)
    # the same load on a quiet machine: its usual reading
    quiet = dict(load, host=HostLoad(cpus=2, load_1m=2.1, own_cores=1.9))
    quiet["steps"] = dict(load["steps"], slowdown=1.05)
    d = check(diagnose([snap(**quiet)]))
    assert d.headline.startswith("ITL high: 3 sequences decode at once")


def test_steps_far_slower_than_their_best_name_the_machine_without_a_load_reading():
    slowed = dict(seqs=decoders(4), itl=pct(0.3), steps=dict(step_s=0.3, slowdown=2.6))
    d = check(diagnose([snap(**slowed)]))
    assert d.headline == "the machine is the limit: steps 2.6× their best"
    assert any("throttled or shared GPU" in line for line in d.details)
    d = check(diagnose([snap(**dict(slowed, steps=dict(step_s=0.3, slowdown=1.6)))]))
    assert d.headline.startswith("ITL high")  # a little slower, no busy host: the load


def test_with_few_slots_a_person_in_one_of_them_is_not_named():
    """2 slots, ten people with one request each: the two running hold half the running set
    and its cells each, their fair share with so few slots. The slot limit is the cause, and
    nobody is named (the old fixed half named whoever held the larger prompt)."""
    running = [seq(0, user="u7", cells=510), seq(1, user="u2", cells=490)]
    others = [u for u in (f"u{i}" for i in range(10)) if u not in ("u7", "u2")]
    after = dict(
        seqs=running,
        waiting_seqs=waiting_for(others),
        free_seq_ids=0,
        max_num_seqs=2,
        kv_committed=1000,
        ttft=pct(3.0, mean=3.1),
        queue=pct(2.5, mean=2.6),
    )
    d = check(diagnose([snap(**after)]))
    assert d.headline.endswith("slot bound"), d.headline
    assert not any(" holds " in line for line in [d.headline, *d.details])
    # one of the two holding most of the cells with a long prompt is still named
    running[0] = seq(0, user="u7", cells=4000)
    d = check(diagnose([snap(**dict(after, seqs=running, kv_committed=4490))]))
    assert any("u7 holds 89% of the cells" in line for line in [d.headline, *d.details])
