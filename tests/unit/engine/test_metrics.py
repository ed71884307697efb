"""Latency windows, histograms, counters and step records (localserve/engine/metrics.py)."""

from __future__ import annotations

import pytest

from localserve.engine.metrics import (
    ITERATION_TOKEN_BUCKETS,
    ITL_BUCKETS,
    LATENCY_BUCKETS,
    TTFT_BUCKETS,
    CumulativeHistogram,
    Metrics,
    Window,
    build_1_2_5_buckets,
    percentiles,
)
from localserve.engine.sampling_params import SamplingParams
from localserve.engine.sequence import FinishReason, Sequence
from localserve.engine.stats import percentile


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def metrics(clock) -> Metrics:
    return Metrics(clock, window_s=60.0)


def make_seq(arrival: float, prompt_len: int = 5, request_id: str = "r1") -> Sequence:
    return Sequence(request_id, list(range(prompt_len)), SamplingParams(), "bob", arrival)


def admit(metrics: Metrics, clock: FakeClock, seq: Sequence, at: float) -> None:
    clock.now = at
    seq.mark_scheduled(at)
    metrics.on_admitted(seq)


def token(metrics: Metrics, clock: FakeClock, seq: Sequence, at: float, eog: bool = False):
    clock.now = at
    seq.append_token(7, b"x", eog, at)
    metrics.on_token(seq)


def window_values(metrics: Metrics, name: str) -> list[float]:
    return getattr(metrics, name).values(metrics.clock())


def histogram(metrics: Metrics, name: str):
    return metrics.export_histograms()[name]


# --- percentiles -----------------------------------------------------------------------------


def test_percentiles_of_nothing_are_none_with_count_zero():
    p = percentiles([])
    assert p.count == 0
    assert (p.p50, p.p90, p.p99, p.mean) == (None, None, None, None)


def test_percentiles_interpolate_like_numpy_and_the_load_generator():
    p = percentiles(reversed(range(1, 101)))  # order does not matter
    assert (p.p50, p.p90, p.p99) == pytest.approx((50.5, 90.1, 99.01))
    assert p.p90 == percentile(range(1, 101), 90)
    assert p.mean == 50.5
    assert p.count == 100


def test_percentiles_of_one_value_are_that_value():
    p = percentiles([0.3])
    assert (p.p50, p.p90, p.p99, p.mean, p.count) == (0.3, 0.3, 0.3, 0.3, 1)


def test_percentiles_of_ten_values_stay_within_them():
    p = percentiles(range(1, 11))
    assert (p.p50, p.p90, p.p99) == pytest.approx((5.5, 9.1, 9.91))


# --- Window ----------------------------------------------------------------------------------


def test_window_drops_values_older_than_its_span():
    w = Window(span_s=10.0)
    for t, v in [(0.0, 1.0), (4.0, 2.0), (5.0, 3.0), (12.0, 4.0)]:
        w.add(t, v)
    assert w.values(now=14.0) == [2.0, 3.0, 4.0]  # cutoff 4.0: a value at the cutoff stays
    assert w.values(now=14.5) == [3.0, 4.0]
    assert w.values(now=100.0) == []


def test_window_keeps_at_most_maxlen_values():
    w = Window(span_s=1e9, maxlen=3)
    for i in range(5):
        w.add(float(i), float(i))
    assert w.values(now=5.0) == [2.0, 3.0, 4.0]


# --- CumulativeHistogram ---------------------------------------------------------------------


def test_histogram_export_is_cumulative_with_le_buckets():
    h = CumulativeHistogram([1.0, 2.0, 3.0])
    for v in [0.5, 1.0, 1.5, 3.0, 10.0]:
        h.observe(v)
    exported = h.export()
    assert exported.buckets == [1.0, 2.0, 3.0]
    assert exported.counts == [2, 3, 4]  # 1.0 falls in the `le 1.0` bucket
    assert exported.count == 5
    assert exported.sum == pytest.approx(16.0)


def test_histogram_value_above_last_bucket_counts_only_in_count_and_sum():
    h = CumulativeHistogram([1.0, 2.0])
    h.observe(50.0)
    exported = h.export()
    assert exported.counts == [0, 0]
    assert (exported.count, exported.sum) == (1, 50.0)


def test_histogram_export_is_a_copy_of_the_buckets():
    h = CumulativeHistogram([1.0])
    h.export().buckets.append(99.0)
    assert h.buckets == [1.0]


@pytest.mark.parametrize(
    "buckets", [TTFT_BUCKETS, ITL_BUCKETS, LATENCY_BUCKETS, ITERATION_TOKEN_BUCKETS]
)
def test_bucket_boundaries_are_strictly_increasing(buckets):
    assert all(a < b for a, b in zip(buckets, buckets[1:], strict=False))


def test_length_buckets_are_vllms_1_2_5_up_to_the_context():
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert build_1_2_5_buckets(4096)[-3:] == [500, 1000, 2000]
    assert build_1_2_5_buckets(0) == []


def test_length_histograms_are_bounded_by_the_context(clock):
    buckets = Metrics(clock, max_model_len=8192).export_histograms()["request_prompt_tokens"]
    assert buckets.buckets[-1] == 5000


# --- Metrics: per-request latencies ----------------------------------------------------------


def test_admission_counts_the_request_and_records_queue_time(metrics, clock):
    seq = make_seq(arrival=100.0, prompt_len=5)
    admit(metrics, clock, seq, at=100.25)
    assert metrics.counters.requests == 1
    assert metrics.counters.prompt_tokens == 5
    assert window_values(metrics, "queue") == [pytest.approx(0.25)]
    h = histogram(metrics, "request_queue_time_seconds")
    assert h.count == 1 and h.sum == pytest.approx(0.25)
    assert metrics.events[-1].kind == "admitted"
    assert metrics.events[-1].t == pytest.approx(0.25)  # since the metrics started


def test_first_token_records_ttft_and_later_tokens_record_itl(metrics, clock):
    seq = make_seq(arrival=100.0)
    admit(metrics, clock, seq, at=100.5)
    token(metrics, clock, seq, at=101.0)
    token(metrics, clock, seq, at=101.25)
    token(metrics, clock, seq, at=101.75)
    assert window_values(metrics, "ttft") == [pytest.approx(1.0)]
    assert window_values(metrics, "itl") == [pytest.approx(0.25), pytest.approx(0.5)]
    assert histogram(metrics, "time_to_first_token_seconds").count == 1
    assert histogram(metrics, "inter_token_latency_seconds").count == 2
    assert metrics.counters.generation_tokens == 3


def test_finish_records_e2e_and_tpot(metrics, clock):
    seq = make_seq(arrival=100.0)
    admit(metrics, clock, seq, at=100.0)
    for at in (101.0, 101.5, 102.0):
        token(metrics, clock, seq, at)
    token(metrics, clock, seq, at=102.5, eog=True)
    metrics.on_finished(seq)
    assert metrics.counters.finished == 1
    assert window_values(metrics, "e2e") == [pytest.approx(2.5)]
    assert window_values(metrics, "tpot") == [pytest.approx(1.5 / 3)]
    assert histogram(metrics, "e2e_request_latency_seconds").sum == pytest.approx(2.5)
    assert histogram(metrics, "request_time_per_output_token_seconds").count == 1
    assert metrics.events[-1].detail == "stop, 4 tokens"


def test_finish_with_one_token_records_no_tpot(metrics, clock):
    seq = make_seq(arrival=100.0)
    admit(metrics, clock, seq, at=100.0)
    token(metrics, clock, seq, at=101.0, eog=True)
    metrics.on_finished(seq)
    assert window_values(metrics, "tpot") == []
    assert histogram(metrics, "request_time_per_output_token_seconds").count == 0
    assert len(window_values(metrics, "e2e")) == 1


def test_cancellations_and_errors_are_counted(metrics, clock):
    cancelled, failed, done = (make_seq(100.0, request_id=r) for r in ("c", "e", "d"))
    cancelled.finish(FinishReason.CANCELLED, 101.0)
    failed.finish(FinishReason.ERROR, 101.0, error="decode failed")
    done.finish(FinishReason.LENGTH, 101.0)
    for seq in (cancelled, failed, done):
        metrics.on_finished(seq)
    c = metrics.counters
    assert (c.finished, c.cancellations, c.errors) == (3, 1, 1)
    assert metrics.events[-2].detail == "error, 0 tokens: decode failed"


def test_rejections_and_preemptions_are_counted(metrics, clock):
    metrics.on_rejected()
    metrics.on_preempted(make_seq(100.0))
    assert (metrics.counters.rejections, metrics.counters.preemptions) == (1, 1)
    assert metrics.events[-1].kind == "preempted"


def test_latency_percentiles_cover_only_the_window(metrics, clock):
    seq = make_seq(arrival=100.0)
    admit(metrics, clock, seq, at=100.0)
    token(metrics, clock, seq, at=100.5)
    assert metrics.latency()["ttft"].count == 1
    clock.now = 100.5 + 61.0
    latency = metrics.latency()
    assert set(latency) == {
        "ttft",
        "itl",
        "queue",
        "e2e",
        "tpot",
        "queue_error",
        "queue_error_share",
    }
    assert latency["ttft"].count == 0
    assert histogram(metrics, "time_to_first_token_seconds").count == 1  # histograms keep all


# --- Metrics: steps --------------------------------------------------------------------------


def test_throughput_spans_from_the_start_of_the_first_recent_step(metrics, clock):
    clock.now = 110.0
    metrics.on_step(4, 100, step_s=1.0, decode_s=0.8, prefill_s=0.5)
    clock.now = 111.0
    metrics.on_step(4, 0, step_s=1.0, decode_s=0.9, prefill_s=0.0)
    # elapsed = now - first step end + its duration = 111 - 110 + 1 = 2 s
    assert metrics.throughput(span_s=10.0) == pytest.approx((50.0, 4.0))
    assert metrics.counters.steps == 2
    assert metrics.counters.prefill_tokens == 100


def test_throughput_ignores_steps_older_than_the_span(metrics, clock):
    clock.now = 100.0
    metrics.on_step(8, 500, 1.0, 0.5, 0.5)
    clock.now = 120.0
    assert metrics.throughput(span_s=10.0) == (0.0, 0.0)


def test_step_stats_averages_recent_steps(metrics, clock):
    metrics.on_step(2, 300, step_s=0.2, decode_s=0.15, prefill_s=0.1)
    metrics.on_step(4, 100, step_s=0.2, decode_s=0.17, prefill_s=0.05)
    stats = metrics.step_stats(prefill_budget=256)
    assert stats.num_steps == 2
    assert stats.step_s == pytest.approx(0.2)
    assert stats.decode_tokens == pytest.approx(3.0)
    assert stats.prefill_tokens == pytest.approx(200.0)
    assert stats.prefill_time_share == pytest.approx(0.15 / 0.4)
    assert stats.engine_share == pytest.approx(1 - 0.32 / 0.4)  # 1 - decode_s / step_s
    assert stats.prefill_budget == 256


def test_step_stats_uses_only_the_last_n_steps(metrics, clock):
    metrics.on_step(100, 0, 1.0, 1.0, 0.0)
    metrics.on_step(2, 0, 1.0, 1.0, 0.0)
    stats = metrics.step_stats(prefill_budget=0, last_n=1)
    assert stats.decode_tokens == 2.0
    assert stats.num_steps == 2  # the counter still counts every step


def test_step_stats_shares_are_clamped(metrics, clock):
    metrics.on_step(1, 10, step_s=0.1, decode_s=0.2, prefill_s=0.5)
    stats = metrics.step_stats(prefill_budget=0)
    assert stats.engine_share == 0.0
    assert stats.prefill_time_share == 1.0


def test_step_stats_without_steps_are_none(metrics):
    stats = metrics.step_stats(prefill_budget=64)
    assert stats.num_steps == 0
    assert stats.step_s is None and stats.engine_share is None
    assert stats.prefill_budget == 64


# --- Metrics: what vLLM observes when a request finishes -------------------------------------


def test_a_finished_request_records_its_lengths_and_phases(metrics, clock):
    seq = Sequence("r1", list(range(30)), SamplingParams(max_tokens=40), "bob", 100.0)
    admit(metrics, clock, seq, at=100.5)
    for at in (101.25, 101.5, 102.0):
        token(metrics, clock, seq, at)
    token(metrics, clock, seq, at=103.0, eog=True)
    metrics.on_finished(seq)
    h = metrics.export_histograms()
    prompt = h["request_prompt_tokens"]
    assert (prompt.count, prompt.sum) == (1, 30)
    assert prompt.counts[:6] == [0, 0, 0, 0, 0, 1]  # le 1, 2, 5, 10, 20, 50
    assert (h["request_generation_tokens"].count, h["request_generation_tokens"].sum) == (1, 4)
    assert h["request_params_max_tokens"].sum == 40
    assert h["request_max_num_generation_tokens"].sum == 40
    assert h["request_prefill_time_seconds"].sum == pytest.approx(0.75)  # admitted -> 1st token
    assert h["request_decode_time_seconds"].sum == pytest.approx(1.75)  # first -> last token
    assert h["request_inference_time_seconds"].sum == pytest.approx(2.5)  # admitted -> last
    assert metrics.counters.finished_stop == 1 and metrics.counters.finished_length == 0


def test_a_request_cancelled_before_its_first_token_has_lengths_but_no_phases(metrics, clock):
    seq = make_seq(arrival=100.0, prompt_len=7)
    seq.finish(FinishReason.CANCELLED, 101.0)
    metrics.on_finished(seq)
    h = metrics.export_histograms()
    assert h["request_prompt_tokens"].sum == 7
    assert (h["request_generation_tokens"].count, h["request_generation_tokens"].sum) == (1, 0)
    for name in ("prefill", "decode", "inference"):
        assert h[f"request_{name}_time_seconds"].count == 0
    assert metrics.counters.cancellations == 1


def test_finish_reasons_add_up_to_finished(metrics, clock):
    reasons = [FinishReason.STOP, FinishReason.LENGTH, FinishReason.LENGTH]
    reasons += [FinishReason.CANCELLED, FinishReason.ERROR]
    for i, reason in enumerate(reasons):
        seq = make_seq(100.0, request_id=f"r{i}")
        seq.finish(reason, 101.0)
        metrics.on_finished(seq)
    c = metrics.counters
    assert (c.finished_stop, c.finished_length, c.cancellations, c.errors) == (1, 2, 1, 1)
    assert c.finished_stop + c.finished_length + c.cancellations + c.errors == c.finished


def test_prefix_cache_queries_and_hits_count_tokens(metrics, clock):
    seq = make_seq(arrival=100.0, prompt_len=50)
    seq.cached_tokens = 32
    admit(metrics, clock, seq, at=100.0)
    admit(metrics, clock, make_seq(arrival=100.0, prompt_len=10, request_id="r2"), at=100.0)
    c = metrics.counters
    assert (c.prefix_cache_queries, c.cached_tokens, c.prefix_hits) == (60, 32, 1)


def test_without_prefix_caching_nothing_is_looked_up(clock):
    metrics = Metrics(clock, prefix_caching=False)
    admit(metrics, clock, make_seq(arrival=100.0, prompt_len=50), at=100.0)
    assert metrics.counters.prefix_cache_queries == 0
    assert metrics.counters.prompt_tokens == 50


def test_each_step_records_its_tokens(metrics, clock):
    metrics.on_step(3, 61, step_s=0.1, decode_s=0.1, prefill_s=0.05)
    metrics.on_step(4, 0, step_s=0.1, decode_s=0.1, prefill_s=0.0)
    h = metrics.export_histograms()["iteration_tokens_total"]
    assert (h.count, h.sum) == (2, 68)
    assert h.counts[:3] == [0, 1, 1]  # le 1, 8, 16: the 4-token step; 64 tokens go in le 64
