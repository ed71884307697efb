#!/usr/bin/env bash
# What does the HTTP path cost against the websocket path, and against llama-server? (issue 11)
# The same client (`localserve bench`) and workload (`short`, ignore_eos; 12 requests at 1 user,
# 64 at 16) against localserve's websocket protocol, its /v1/chat/completions, its
# /v1/completions, and llama-server's /v1/completions (same model, context, slots, threads,
# batch). ROUNDS rounds (default 2) alternate the three localserve paths on one server process;
# llama-server runs after it (skipped without LLAMA_SERVER).
#   LLAMA_SERVER=/tmp/llama-build/bin/llama-server bash benchmarks/http_vs_websocket.sh
# Prints one table: per path and number of users, each round's output tok/s, TTFT and ITL p50 /
# p99, and failures. JSON and logs in OUT (default bench-results/http_vs_websocket).
# Figures: docs/benchmarks.md, "The HTTP path against the websocket path, and against
# llama-server" (issue 11).
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/common.sh
OUT=${OUT:-bench-results/http_vs_websocket}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"

one() {  # name round concurrency requests args...
  local name=$1 round=$2 c=$3 n=$4; shift 4
  $LS bench "$@" --workload short --num-requests "$n" --concurrency "$c" --ignore-eos \
    --out "$OUT/$name-c$c-r$round.json" >/dev/null
}

$LS serve --port 8765 >"$OUT/localserve.log" 2>&1 &
pid=$!
wait_for http://127.0.0.1:8765/healthz
one warmup 0 4 8 --url ws://127.0.0.1:8765
for round in $(seq "$ROUNDS"); do
  for c_n in "1 12" "16 64"; do
    set -- $c_n
    one ws "$round" "$1" "$2" --url ws://127.0.0.1:8765
    one v1chat "$round" "$1" "$2" --peer http://127.0.0.1:8765 --endpoint chat
    one v1completions "$round" "$1" "$2" --peer http://127.0.0.1:8765
  done
done
kill -INT $pid; wait $pid || true

if [ -n "${LLAMA_SERVER:-}" ]; then
  llama_server 8080 >"$OUT/llama-server.log" 2>&1 &
  pid=$!
  wait_for http://127.0.0.1:8080/health
  one llama-warmup 0 4 8 --peer http://127.0.0.1:8080
  for round in $(seq "$ROUNDS"); do
    for c_n in "1 12" "16 64"; do
      set -- $c_n
      one llama-server "$round" "$1" "$2" --peer http://127.0.0.1:8080
    done
  done
  kill $pid; wait $pid || true
fi

.venv/bin/python - "$OUT" <<'PY'
import glob, json, sys
rows = {}
for path in sorted(glob.glob(f"{sys.argv[1]}/*-c*-r*.json")):
    name = path.rsplit("/", 1)[1].rsplit("-c", 1)[0]
    if "warmup" in name:
        continue
    c = path.rsplit("-c", 1)[1].split("-r")[0]
    s = json.load(open(path))["summary"]
    rows.setdefault((name, int(c)), []).append(s)
print("| path | users | output tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | failed |")
print("|---|---:|---:|---:|---:|---:|")
for (name, c), runs in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    tput = " / ".join(f"{s['output_token_throughput']:.1f}" for s in runs)
    ttft = " and ".join(f"{s['ttft_ms']['median']:.0f} / {s['ttft_ms']['p99']:.0f}" for s in runs)
    itl = " and ".join(f"{s['itl_ms']['median']:.0f} / {s['itl_ms']['p99']:.0f}" for s in runs)
    print(f"| {name} | {c} | {tput} | {ttft} | {itl} | {sum(s['failed'] for s in runs)} |")
PY
