"""engine_process_boundary.sh's tables: each run's figures, then the ratios, paired in a round.

Measures nothing: it reads what engine_process_boundary.sh wrote (issue 17) and prints it.

    .venv/bin/python benchmarks/engine_process_boundary_report.py [OUT]

OUT defaults to bench-results/engine_process_boundary. Prints, per number of users, a table of
each server's runs (ok/failed, stalls, TTFT p50/p90, ITL p50, TPOT p50, tok/s, C/TPOT), then one
table of ratios (process/inproc, split/process, split/inproc).

Reads NAME-rROUND-cC.json (`localserve bench --out`), NAME in inproc, process, split.
On a shared machine another process's load shows up as stalls (token gaps of seconds, as when
llama.cpp's threads are descheduled); a run's wall-time tok/s takes them in full, so each run
also gets its count of stalls and a decode rate from the median TPOT (C * 1000 / TPOT p50),
which they barely move. Ratios are taken within a round and summarized by their median.
"""

from __future__ import annotations

import glob
import json
import re
import statistics
import sys

SERVERS = ("inproc", "process", "split")
STALL_S = 1.0  # a token gap this long is another process's doing, not the engine's
# (numerator, denominator, what it measures)
RATIOS = (
    ("process", "inproc", "process boundary"),
    ("split", "process", "split vs unsplit"),
    ("split", "inproc", "split vs the old way"),
)
KEYS = (("tok_s", "out tok/s"), ("decode", "C/TPOT"), ("itl50", "ITL p50"),
        ("tpot50", "TPOT p50"), ("ttft50", "TTFT p50"))


def load(out: str) -> dict[tuple[str, int, int], dict]:
    runs = {}
    for path in glob.glob(f"{out}/*-r*-c*.json"):
        m = re.fullmatch(r"(\w+)-r(\d+)-c(\d+)\.json", path.rsplit("/", 1)[1])
        if m and m[1] in SERVERS:
            runs[m[1], int(m[2]), int(m[3])] = json.load(open(path))
    return runs


def stalls(record: dict) -> int:
    """Distinct token gaps of STALL_S or more (requests batched together share them)."""
    seen = set()
    for r in record["requests"]:
        t = r["token_times"]
        seen |= {round(b, 1) for a, b in zip(t, t[1:]) if b - a >= STALL_S}
    return len(seen)


def figures(record: dict, c: int) -> dict[str, float | None]:
    s = record["summary"]
    tpot = s["tpot_ms"]["median"]
    return {
        "ttft50": s["ttft_ms"]["median"],
        "ttft90": s["ttft_ms"]["p90"],
        "itl50": s["itl_ms"]["median"],
        "tpot50": tpot,
        "tok_s": s["output_token_throughput"],
        "decode": c * 1e3 / tpot if tpot else None,
    }


def num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def main(out: str) -> None:
    runs = load(out)
    rounds = sorted({r for _, r, _ in runs})
    users = sorted({c for *_, c in runs})
    for c in users:
        print(f"\n### {c} user{'s' * (c > 1)}\n")
        print("| server | round | ok/failed | stalls | TTFT p50 | TTFT p90 | ITL p50 | TPOT p50 "
              "| out tok/s | C/TPOT |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name in SERVERS:
            for r in rounds:
                rec = runs.get((name, r, c))
                if rec is None:
                    continue
                s, f = rec["summary"], figures(rec, c)
                print(
                    f"| {name} | {r} | {s['completed']}/{s['failed']} | {stalls(rec)} "
                    f"| {num(f['ttft50'], 0)} | {num(f['ttft90'], 0)} | {num(f['itl50'])} "
                    f"| {num(f['tpot50'])} | {num(f['tok_s'])} | {num(f['decode'])} |"
                )
    print("\n### Ratios: median over rounds of the ratio within a round (each round's in brackets)\n")
    print("| ratio | users | " + " | ".join(label for _, label in KEYS) + " |")
    print("|---|---:|" + "---:|" * len(KEYS))
    for a, b, what in RATIOS:
        for c in users:
            cells = []
            for key, _ in KEYS:
                per_round = []
                for r in rounds:
                    ra, rb = runs.get((a, r, c)), runs.get((b, r, c))
                    if ra and rb:
                        x, y = figures(ra, c)[key], figures(rb, c)[key]
                        if x and y:
                            per_round.append(x / y)
                cells.append(
                    "-" if not per_round
                    else f"{statistics.median(per_round):.2f} "
                    f"({', '.join(f'{v:.2f}' for v in per_round)})"
                )
            print(f"| {a}/{b} ({what}) | {c} | " + " | ".join(cells) + " |")
    print("\nms for TTFT, ITL, TPOT (medians, p90 over the run's requests); out tok/s = output "
          "tokens / the run's wall time; C/TPOT = users * 1000 / TPOT p50; stalls = distinct "
          f"token gaps >= {STALL_S:.0f} s.")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench-results/engine_process_boundary")
