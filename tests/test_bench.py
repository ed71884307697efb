"""The load generator: statistics on synthetic timings, arrival processes, one smoke run."""

from __future__ import annotations

import asyncio
import math
import statistics

import numpy as np
import pytest

from localserve.bench import (
    SLO,
    RequestResult,
    arrival_times,
    build_requests,
    percentile,
    run_load,
    summarize,
)


def result(sent: float, gaps: list[float], ttft: float, ok: bool = True, tokens=None):
    """A request sent at `sent`, first token after `ttft`, then token frames `gaps` apart."""
    times = [sent + ttft]
    for gap in gaps:
        times.append(times[-1] + gap)
    n = tokens if tokens is not None else len(times)
    return RequestResult("short", ok=ok, error="" if ok else "busy", prompt_tokens=10,
                         output_tokens=n if ok else 0, sent=sent,
                         token_times=times if ok else [], done=times[-1])  # fmt: skip


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy(q):
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.3]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_of_nothing_is_none():
    assert percentile([], 50) is None


def test_request_timings_follow_vllm_definitions():
    r = result(sent=10.0, gaps=[0.1, 0.2, 0.3], ttft=0.5)
    assert r.ttft == pytest.approx(0.5)
    assert r.e2e == pytest.approx(0.5 + 0.6)
    assert r.tpot == pytest.approx(0.6 / 3)  # (e2e - ttft) / (n - 1)
    assert r.itls == pytest.approx([0.1, 0.2, 0.3])


def test_coalesced_frames_make_tpot_differ_from_itl():
    # 4 tokens arrived in 2 frames: ITL sees one gap, TPOT spreads it over 3 tokens
    r = result(sent=0.0, gaps=[0.3], ttft=0.2, tokens=4)
    assert r.itls == pytest.approx([0.3]) and r.tpot == pytest.approx(0.1)


def test_summary_counts_throughput_and_percentiles():
    results = [result(0.0, [0.1] * 9, 0.2), result(0.0, [0.1] * 4, 0.4),
               result(0.0, [], 0.1, ok=False)]  # fmt: skip
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
    assert [slo.met(r) for r in (fast, slow_start, slow_tokens, failed)] == [True, False, False,
                                                                            False]  # fmt: skip
    s = summarize([fast, slow_start, slow_tokens, failed], duration_s=4.0, slo=slo)
    assert s["good_requests"] == 1 and s["goodput"] == pytest.approx(0.25)


def test_bad_slo_text_is_a_clear_error():
    with pytest.raises(ValueError, match="ttft=MS"):
        SLO.parse("latency=5")


def test_poisson_arrivals_have_the_asked_rate():
    times = arrival_times(4000, rate=5.0, seed=1)
    gaps = np.diff(times)
    assert times[0] == 0.0
    assert statistics.mean(gaps) == pytest.approx(0.2, rel=0.05)
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, rel=0.1)


def test_burstiness_below_one_makes_arrivals_burstier():
    smooth = np.diff(arrival_times(4000, rate=5.0, burstiness=4.0, seed=2))
    bursty = np.diff(arrival_times(4000, rate=5.0, burstiness=0.25, seed=2))
    for gaps in (smooth, bursty):
        assert gaps.mean() == pytest.approx(0.2, rel=0.1)  # same rate
    cv = lambda g: g.std() / g.mean()  # noqa: E731
    assert cv(smooth) == pytest.approx(0.5, rel=0.1)  # 1 / sqrt(shape)
    assert cv(bursty) == pytest.approx(2.0, rel=0.1)


def test_infinite_rate_sends_everything_at_once():
    assert arrival_times(5, rate=math.inf) == [0.0] * 5


def test_workloads_are_reproducible_and_mixed():
    a, b = build_requests("mixed", 200, seed=3), build_requests("mixed", 200, seed=3)
    assert a == b and a != build_requests("mixed", 200, seed=4)
    kinds = [r.kind for r in a]
    assert {"short", "long", "paste"} == set(kinds)
    assert 0.35 < kinds.count("short") / 200 < 0.65
    paste = next(r for r in a if r.kind == "paste")
    assert len(paste.prompt.split()) > 1500


def test_unknown_workload_is_refused():
    with pytest.raises(ValueError, match="--workload"):
        build_requests("everything", 3)


@pytest.mark.model
def test_smoke_run_against_a_real_server(live):
    specs = build_requests("short", 6, seed=1)
    seen = []
    results, duration = asyncio.run(
        run_load(
            live.url, specs, concurrency=2, ignore_eos=True, on_done=lambda d, t: seen.append(d)
        )
    )
    s = summarize(results, duration, SLO.parse("ttft=60000"))
    assert s["completed"] == 6 and s["failed"] == 0 and seen == [1, 2, 3, 4, 5, 6]
    assert s["output_tokens"] == 6 * 48  # ignore_eos: fixed lengths
    assert s["ttft_ms"]["median"] > 0 and s["itl_ms"]["p99"] >= s["itl_ms"]["median"]
    assert s["good_requests"] == 6
    live.wait_idle()


def test_peer_mode_reads_an_openai_sse_stream():
    """The OpenAI-compatible client against a minimal SSE endpoint (the real peer is
    llama-server, used in the benchmarks; this checks the parsing and the timings)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from localserve.bench import RequestSpec, send_one_openai

    seen = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            seen["path"] = self.path
            seen["body"] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunks = [{"choices": [{"text": t, "finish_reason": None}]} for t in ("Pa", "ris", ".")]
            chunks.append({"choices": [{"text": "", "finish_reason": "length"}]})
            chunks.append({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3}})
            for chunk in chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        spec = RequestSpec("short", "What is the capital of France?", 3)
        r = asyncio.run(send_one_openai(url, "u", spec, ignore_eos=True, seed=5))
    finally:
        server.shutdown()
    assert seen["path"] == "/v1/completions"
    body = seen["body"]
    assert body["prompt"].endswith("User: What is the capital of France?\nAssistant:")
    assert body["stream"] and body["ignore_eos"] and body["stop"] == [] and body["seed"] == 5
    assert r.ok and r.finish_reason == "length" and (r.prompt_tokens, r.output_tokens) == (12, 3)
    assert len(r.token_times) == 3 and r.ttft is not None and r.e2e >= r.ttft


def sweep_point(policy, workload, c, tps, ttft_p99, itl_p99):
    dist = lambda p99: {"mean": p99 / 2, "median": p99 / 2, "p90": p99, "p99": p99}  # noqa: E731
    return {"policy": policy, "workload": workload, "concurrency": c, "completed": 4,
            "failed": 0, "request_throughput": c / 4, "output_token_throughput": tps,
            "ttft_ms": dist(ttft_p99), "itl_ms": dist(itl_p99), "tpot_ms": dist(itl_p99),
            "e2e_ms": dist(ttft_p99 * 3)}  # fmt: skip


def test_sweep_writes_json_markdown_and_an_svg_chart(tmp_path):
    import json
    import xml.etree.ElementTree as ET

    from localserve.sweep import write_results

    points = [sweep_point(pol, "chat", c, tps * c, 100 * c, 20 + c)
              for pol, tps in (("continuous", 40), ("static", 25)) for c in (1, 2, 4)]  # fmt: skip
    out = write_results(points, tmp_path)
    assert json.loads((out / "sweep.json").read_text()) == points
    table = (out / "sweep.md").read_text().splitlines()
    assert len(table) == 2 + len(points) and "| continuous | chat | 4 |" in table[4]
    svg = ET.parse(out / "sweep.svg").getroot()
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 4  # two series in each of the two panels
