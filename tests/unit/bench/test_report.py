"""The load generator's figures (localserve/bench/report.py) on synthetic timings: throughput,
percentiles, goodput against SLOs, the conversation report per turn, and the tables printed."""

from __future__ import annotations

import pytest

from localserve.bench.report import (
    SLO,
    format_conversations,
    format_origin,
    format_summary,
    summarize,
    summarize_conversations,
)
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


def test_the_summary_prints_as_a_table_not_a_dict():
    fast, slow = result(0.0, [0.05] * 4, 0.2), result(0.0, [0.5] * 4, 0.4)
    slo = SLO.parse("ttft=1000,tpot=100")
    table = format_summary(summarize([fast, slow, result(0.0, [], 0.1, ok=False)], 4.0, slo))
    lines = table.splitlines()
    assert lines[0] == "completed 2, failed 1 (busy 1)"
    assert "requests/s           0.50" in lines and "output tokens          10" in lines
    assert lines[lines.index("") + 1].split() == ["(ms)", "mean", "median", "p90", "p99"]
    ttft = next(line for line in lines if line.startswith("TTFT"))
    assert ttft.split() == ["TTFT", "300.0", "300.0", "380.0", "398.0"]
    assert lines[-1] == "goodput 0.25 requests/s: 1 of 3 met TTFT <= 1000 ms, TPOT <= 100 ms"
    assert "{" not in table and "'" not in table
    # nothing measured: dashes, not None
    empty = format_summary(summarize([result(0.0, [], 0.1, ok=False)], 1.0))
    assert empty.splitlines()[-1].split() == ["E2E", "–", "–", "–", "–"] and "None" not in empty


def test_the_origin_scenario_prints_as_a_table():
    figures = {
        "paste_prompt_tokens": 3012,
        "paste_ttft_ms": 2345.6,
        "worst_stream_gap_during_paste_ms": 180.2,
        "median_stream_gap_during_paste_ms": None,
        "question_ttft_idle_ms": 60.0,
        "question_ttft_during_paste_ms": 402.0,
        "ttft_ratio": 6.7,
        "all_ok": False,
    }
    lines = format_origin(figures).splitlines()
    assert lines[0] == "the paste                   3012 prompt tokens"
    assert "  worst gap                 180 ms" in lines
    assert "  median gap                –" in lines
    assert "  ratio                     6.7 x" in lines
    assert lines[-1] == "every request succeeded     no"


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
    assert " cold  2/2 " in table and "  not_reached 1" in table and "{" not in table
    # without a cold replay: no ratio
    assert summarize_conversations([a, b], 1.0)["last_turn"]["ratio_to_cold"] is not None
    a.cold = b.cold = None
    s = summarize_conversations([a, b], 1.0)
    assert s["cold"] is None and s["last_turn"]["ratio_to_cold"] is None
