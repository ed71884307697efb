"""`localserve sweep`: concurrency x workload x policy, side by side, with a table and a chart.

For each scheduling policy an in-process server is started on the same model; each workload is
run closed-loop at each concurrency with `localserve bench`'s client, and every point's summary
is kept. Results go out as JSON, a Markdown table and an SVG chart of throughput against TTFT
and ITL p99 — where the curves bend is where batching stops being free.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from pathlib import Path

import msgspec

from localserve import bench
from localserve.bench import runs
from localserve.config import Config
from localserve.runners.models import terminal_progress
from localserve.serve.serving import serving

COLORS = {"continuous": "#1f77b4", "static": "#d62728", "llama-server": "#2ca02c"}
DASHES = ["", "6 3", "2 2", "8 2 2 2"]


def run_sweep(
    config: Config,
    runner,
    model_name: str,
    policies: Sequence[str],
    workloads: Sequence[str],
    concurrencies: Sequence[int],
    requests_per_point: int,
    seed: int = 0,
) -> list[dict]:
    """Every (policy, workload, concurrency) point's summary."""
    points = []
    for policy in policies:
        scheduler = msgspec.structs.replace(config.scheduler, policy=policy)
        server = msgspec.structs.replace(config.server, usage=False)  # a benchmark: no record
        policy_config = msgspec.structs.replace(config, scheduler=scheduler, server=server)
        with serving(policy_config, model_name, runner=runner, thread=True) as served:
            url = served.thread.url
            for workload in workloads:
                for c in concurrencies:
                    points.append(_point(url, policy, workload, c, requests_per_point, seed))
    return points


def _point(url: str, policy: str, workload: str, c: int, n: int, seed: int) -> dict:
    specs = bench.build_requests(workload, max(n, 2 * c), seed)
    label = f"{policy:<10} {workload:<6} c={c:<2}"
    load = runs.run_load(
        bench.target(url),
        specs,
        concurrency=c,
        ignore_eos=True,
        seed=seed,
        on_done=terminal_progress(label),
    )
    results, duration = asyncio.run(load)
    summary = bench.summarize(results, duration)
    return {"policy": policy, "workload": workload, "concurrency": c, **summary}


def markdown_table(points: Sequence[dict]) -> str:
    head = (
        "| policy | workload | concurrency | req/s | output tok/s | TTFT p50 / p99 (ms) "
        "| ITL p50 / p99 (ms) | failed |"
    )
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|"]
    for p in points:
        ttft, itl = p["ttft_ms"], p["itl_ms"]
        lines.append(
            f"| {p['policy']} | {p['workload']} | {p['concurrency']} "
            f"| {p['request_throughput']:.2f} | {p['output_token_throughput']:.1f} "
            f"| {_n(ttft['median'])} / {_n(ttft['p99'])} | {_n(itl['median'])} / {_n(itl['p99'])} "
            f"| {p['failed']} |"
        )
    return "\n".join(lines) + "\n"


def svg_chart(points: Sequence[dict], title: str = "throughput vs latency") -> str:
    """Two panels: output tokens/s (x) against TTFT p99 and ITL p99 (y, log scale)."""
    panels = [("ttft_ms", "TTFT p99 (ms)"), ("itl_ms", "ITL p99 (ms)")]
    width, height, pad = 900, 360, 60
    panel_w = (width - 3 * pad) / 2
    xs = [p["output_token_throughput"] for p in points] or [1.0]
    x_max = max(xs) * 1.1 or 1.0
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="15">{title}</text>',
    ]
    series = sorted({(p["policy"], p["workload"]) for p in points})
    workloads = sorted({w for _, w in series})
    for k, (key, label) in enumerate(panels):
        x0 = pad + k * (panel_w + pad)
        values = [p[key]["p99"] for p in points if p[key]["p99"]]
        y_lo, y_hi = _log_range(values)
        out += _axes(x0, pad, panel_w, height - 2 * pad, x_max, y_lo, y_hi, label)
        for policy, workload in series:
            line = sorted(
                (
                    p
                    for p in points
                    if (p["policy"], p["workload"]) == (policy, workload) and p[key]["p99"]
                ),
                key=lambda p: p["concurrency"],
            )
            coords = [
                (
                    x0 + p["output_token_throughput"] / x_max * panel_w,
                    _y(p[key]["p99"], y_lo, y_hi, pad, height - 2 * pad),
                    p["concurrency"],
                )
                for p in line
            ]
            color = COLORS.get(policy, "#555")
            dash = DASHES[workloads.index(workload) % len(DASHES)]
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in coords)
            out.append(
                f'<polyline points="{path}" fill="none" stroke="{color}" '
                f'stroke-width="2" stroke-dasharray="{dash}"/>'
            )
            for x, y, c in coords:
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>')
                out.append(f'<text x="{x + 4:.1f}" y="{y - 4:.1f}" font-size="9">{c}</text>')
    legend_y = height - 18
    for i, (policy, workload) in enumerate(series):
        x = pad + i * 170
        color, dash = COLORS.get(policy, "#555"), DASHES[workloads.index(workload) % len(DASHES)]
        out.append(
            f'<line x1="{x}" y1="{legend_y}" x2="{x + 24}" y2="{legend_y}" '
            f'stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>'
        )
        out.append(f'<text x="{x + 30}" y="{legend_y + 4}">{policy}, {workload}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _log_range(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return 1.0, 10.0
    lo, hi = min(values), max(values)
    return 10 ** math.floor(math.log10(max(lo, 1e-3))), 10 ** math.ceil(math.log10(max(hi, 1e-3)))


def _y(value: float, lo: float, hi: float, top: float, h: float) -> float:
    frac = (math.log10(value) - math.log10(lo)) / max(math.log10(hi) - math.log10(lo), 1e-9)
    return top + h - frac * h


def _axes(x0, y0, w, h, x_max, y_lo, y_hi, label) -> list[str]:
    parts = [
        f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#888"/>',
        f'<text x="{x0 + w / 2}" y="{y0 + h + 32}" text-anchor="middle">'
        "output tokens/s (labels: concurrency)</text>",
        f'<text x="{x0 - 45}" y="{y0 + h / 2}" transform="rotate(-90 {x0 - 45} {y0 + h / 2})" '
        f'text-anchor="middle">{label}</text>',
    ]
    decade = y_lo
    while decade <= y_hi * 1.0001:
        y = _y(decade, y_lo, y_hi, y0, h)
        parts.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{x0 - 4}" y="{y + 4:.1f}" text-anchor="end">{decade:g}</text>')
        decade *= 10
    for i in range(5):
        v = x_max * i / 4
        x = x0 + w * i / 4
        parts.append(f'<text x="{x:.1f}" y="{y0 + h + 15}" text-anchor="middle">{v:.0f}</text>')
    return parts


def write_results(points: Sequence[dict], out_dir: str | Path) -> Path:
    """sweep.json, sweep.md and sweep.svg in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(list(points), indent=1))
    (out / "sweep.md").write_text(markdown_table(points))
    (out / "sweep.svg").write_text(svg_chart(points))
    return out


def _n(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}"
