"""The sweep's results (localserve/bench/sweep.py): JSON, a markdown table and an SVG chart."""

from __future__ import annotations


def sweep_point(policy, workload, c, tps, ttft_p99, itl_p99):
    dist = lambda p99: {"mean": p99 / 2, "median": p99 / 2, "p90": p99, "p99": p99}  # noqa: E731
    return {
        "policy": policy,
        "workload": workload,
        "concurrency": c,
        "completed": 4,
        "failed": 0,
        "request_throughput": c / 4,
        "output_token_throughput": tps,
        "ttft_ms": dist(ttft_p99),
        "itl_ms": dist(itl_p99),
        "tpot_ms": dist(itl_p99),
        "e2e_ms": dist(ttft_p99 * 3),
    }


def test_sweep_writes_json_markdown_and_an_svg_chart(tmp_path):
    import json
    import xml.etree.ElementTree as ET

    from localserve.bench.sweep import write_results

    points = [
        sweep_point(pol, "chat", c, tps * c, 100 * c, 20 + c)
        for pol, tps in (("continuous", 40), ("static", 25))
        for c in (1, 2, 4)
    ]
    out = write_results(points, tmp_path)
    assert json.loads((out / "sweep.json").read_text()) == points
    table = (out / "sweep.md").read_text().splitlines()
    assert len(table) == 2 + len(points) and "| continuous | chat | 4 |" in table[4]
    svg = ET.parse(out / "sweep.svg").getroot()
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 4  # two series in each of the two panels
