#!/usr/bin/env bash
# Does a change move the engine's figures or the origin scenario's? (issue 13: a structural step
# that must change no figure) The engine benchmark (`bench-engine --concurrency 1,16 --tokens
# 48`) and the origin scenario (`serve`, then `bench --origin`), before (BEFORE, a checkout of
# the commit before the change) and after (this checkout), in ROUNDS alternating rounds (default
# 2) on one machine. Each side runs from its own checkout's sources; the same client (this
# checkout's `localserve bench`) measures both servers.
#   git worktree add /tmp/before <commit> && BEFORE=/tmp/before bash benchmarks/compare_checkouts.sh
# Prints two tables, one row per side and round: engine / bare at 1 and 16 sequences with the
# engine's tok/s at 16, then the origin scenario's worst stream gap, late and idle question TTFT
# and paste TTFT. JSON and logs in OUT (default bench-results/compare_checkouts).
# Figures: docs/benchmarks.md, "The structural step changes no figure (issue 13)".
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/common.sh
OUT=${OUT:-bench-results/compare_checkouts}
ROUNDS=${ROUNDS:-2}
BEFORE=${BEFORE:?a checkout of the code before the change}
PY=$PWD/.venv/bin/python
AFTER=$PWD
mkdir -p "$OUT"

engine() {  # which dir round: the engine benchmark, run from that checkout's sources
  (cd "$2" && "$PY" -m localserve bench-engine --concurrency 1,16 --tokens 48 \
    --out "$AFTER/$OUT/engine-$1-r$3.json" >"$AFTER/$OUT/engine-$1-r$3.log" 2>&1)
}

origin() {  # which dir round: `serve` from that checkout, the origin scenario against it
  (cd "$2" && exec "$PY" -m localserve serve --port 8765) >"$OUT/serve-$1-r$3.log" 2>&1 &
  local pid=$!
  wait_for http://127.0.0.1:8765/healthz
  $LS bench --origin --url ws://127.0.0.1:8765 --out "$OUT/origin-$1-r$3.json" >/dev/null || true
  kill -INT $pid; wait $pid || true
}

for round in $(seq "$ROUNDS"); do
  if (( round % 2 )); then order="before after"; else order="after before"; fi
  for which in $order; do
    dir=$AFTER; [ "$which" = before ] && dir=$BEFORE
    engine "$which" "$dir" "$round"
    origin "$which" "$dir" "$round"
  done
done

"$PY" - "$OUT" <<'PY'
import glob, json, sys
out = sys.argv[1]
print("| run | 1 seq: engine / bare | 16 seqs: engine / bare | 16 seqs: engine tok/s |")
print("|---|---:|---:|---:|")
for path in sorted(glob.glob(f"{out}/engine-*.json")):
    rows = {r["concurrency"]: r for r in json.load(open(path))["decode"]}
    name = path.rsplit("/", 1)[1].removesuffix(".json").removeprefix("engine-")
    print(f"| {name} | {rows[1]['ratio']:.1%} | {rows[16]['ratio']:.1%} "
          f"| {rows[16]['engine']['tokens_per_s']:.1f} |")
print()
print("| run | worst stream gap during the paste (ms) | late question TTFT (ms) | "
      "its idle TTFT (ms) | paste TTFT (ms) |")
print("|---|---:|---:|---:|---:|")
for path in sorted(glob.glob(f"{out}/origin-*.json")):
    f = json.load(open(path))
    name = path.rsplit("/", 1)[1].removesuffix(".json").removeprefix("origin-")
    keys = ("worst_stream_gap_during_paste_ms", "question_ttft_during_paste_ms",
            "question_ttft_idle_ms", "paste_ttft_ms")
    print(f"| {name} | " + " | ".join(f"{f.get(k) or 0:,.0f}" for k in keys) + " |")
PY
