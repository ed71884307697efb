"""The load generator's figures (localserve/bench/report.py) on synthetic timings: throughput,
percentiles, goodput against SLOs, and the conversation report per turn."""

from __future__ import annotations

import pytest

from localserve.bench.report import SLO, format_conversations, summarize, summarize_conversations
from localserve.bench.runs import ConversationResult
from localserve.engine.stats import percentile
from tests.support.bench import result


def test_summary_counts_throughput_and_percentiles():
    results = [
        result(0.0, [0.1] * 9, 0.2),
        result(0.0, [0.1] * 4, 0.4),
        result(0.0, [], 0.1, ok=False),
    ]
    s = summarize(results, duration_s=2.0)
    assert s["completed"] == 2 and s["failed"] == 1 and s["errors"] == {"busy": 1}
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_token_throughput"] == pytest.approx((10 + 5) / 2.0)
    assert s["total_token_throughput"] == pytest.approx((10 + 5 + 20) / 2.0)
    assert s["ttft_ms"]["mean"] == pytest.approx(300.0)
    assert s["ttft_ms"]["median"] == pytest.approx(300.0)
    assert s["itl_ms"]["median"] == pytest.approx(100.0)
    assert s["e2e_ms"]["p99"] == pytest.approx(percentile([1100.0, 800.0], 99))


def test_goodput_counts_requests_meeting_every_slo():
    fast = result(0.0, [0.05] * 4, 0.2)
    slow_start = result(0.0, [0.05] * 4, 2.0)
    slow_tokens = result(0.0, [0.5] * 4, 0.2)
    failed = result(0.0, [], 0.1, ok=False)
    slo = SLO.parse("ttft=1000,tpot=100")
    assert [slo.met(r) for r in (fast, slow_start, slow_tokens, failed)] == [
        True,
        False,
        False,
        False,
    ]
    s = summarize([fast, slow_start, slow_tokens, failed], duration_s=4.0, slo=slo)
    assert s["good_requests"] == 1 and s["goodput"] == pytest.approx(0.25)


def test_bad_slo_text_is_a_clear_error():
    with pytest.raises(ValueError, match="ttft=MS"):
        SLO.parse("latency=5")


def turn(ttft: float, prompt: int, cached: int, ok: bool = True, kind: str = "turn"):
    r = result(0.0, [0.05] * 3, ttft, ok=ok)
    r.kind, r.prompt_tokens, r.cached_tokens = kind, prompt, cached
    return r


def test_report_aggregates_per_turn_with_the_cold_replay_and_the_ratio():
    a = ConversationResult(
        0,
        "conv-0",
        [turn(1.0, 400, 0), turn(0.2, 800, 390)],
        ["x", "y"],
        cold=turn(2.0, 800, 0, kind="cold"),
    )
    b = ConversationResult(
        1,
        "conv-1",
        [turn(1.2, 410, 0), turn(0.4, 820, 400)],
        ["x", "y"],
        cold=turn(3.0, 820, 0, kind="cold"),
    )
    c = ConversationResult(2, "conv-2", [turn(1.1, 420, 0, ok=False)], [""])
    s = summarize_conversations([a, b, c], duration_s=9.0)
    assert s["conversations"] == 3 and s["completed"] == 2
    one, two = s["turns"]
    assert one["turn"] == 1 and one["completed"] == 2 and one["failed"] == 1
    assert one["errors"] == {"busy": 1}
    assert two["completed"] == 2 and two["failed"] == 1 and two["errors"] == {"not_reached": 1}
    assert one["ttft_ms"]["mean"] == pytest.approx(1100.0)
    assert two["ttft_ms"]["median"] == pytest.approx(300.0)
    assert two["ttft_ms"]["p90"] == pytest.approx(380.0)
    assert two["prompt_tokens"] == {"mean": 810.0, "min": 800, "max": 820}
    assert two["cached_tokens"]["mean"] == pytest.approx(395.0)
    assert two["cached_share"] == pytest.approx(790 / 1620)
    cold = s["cold"]
    assert cold["turn"] == "cold" and cold["completed"] == 2 and cold["cached_tokens"]["max"] == 0
    last = s["last_turn"]
    assert last["turn"] == 2 and last["ttft_median_ms"] == pytest.approx(300.0)
    assert last["ratio_to_cold"] == pytest.approx(300.0 / 2500.0)
    table = format_conversations(s)
    assert "turn 2 TTFT median 300 ms, cold 2500 ms: 12%" in table
    assert " cold  2/2 " in table and "{'not_reached': 1}" in table
    # without a cold replay: no ratio
    assert summarize_conversations([a, b], 1.0)["last_turn"]["ratio_to_cold"] is not None
    a.cold = b.cold = None
    s = summarize_conversations([a, b], 1.0)
    assert s["cold"] is None and s["last_turn"]["ratio_to_cold"] is None
