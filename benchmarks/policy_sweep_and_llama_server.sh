#!/usr/bin/env bash
# Does continuous batching beat static batching as users are added, and does localserve beat
# llama-server on the same model, threads, slots and context? (issue 5, the first-party experiment)
#   1. `localserve sweep --workloads chat,mixed --concurrency 1,2,4,8,16`: an in-process server
#      per scheduling policy (continuous, static), REQUESTS requests per point (default 8);
#   2. `localserve serve`, then llama-server (common.sh's flags), each measured by the same
#      `localserve bench`: the mixed workload (32 requests, 8 users, ignore_eos, goodput against
#      TTFT 10 s and TPOT 250 ms) and the origin scenario (`bench --origin`).
# Run on a quiet machine (without LLAMA_SERVER the llama-server runs are skipped):
#   LLAMA_SERVER=/tmp/llama-build/bin/llama-server bash benchmarks/policy_sweep_and_llama_server.sh
# Prints the sweep's table and each server's mixed-workload summary. Into OUT (default
# bench-results/policy_sweep_and_llama_server): sweep.json, sweep.md, sweep.svg (throughput
# against TTFT and ITL p99), NAME-mixed.json/.txt and NAME-origin.json per server, the logs.
# llama-server is built from the llama.cpp sources vendored in the llama-cpp-python 0.3.36
# source package (docs/benchmarks.md has the commands). Figures: docs/benchmarks.md, "The
# first-party experiment: continuous vs static, and llama-server (issue 5)".
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/common.sh
OUT=${OUT:-bench-results/policy_sweep_and_llama_server}
REQUESTS=${REQUESTS:-8}
mkdir -p "$OUT"


# 1. sweeps: in-process servers, one per policy
$LS sweep --workloads chat,mixed --concurrency 1,2,4,8,16 --num-requests "$REQUESTS" --out-dir "$OUT"

# 2. localserve, then llama-server, on the same workload and the origin scenario
side_by_side() {  # name url [--peer]
  local name=$1 url=$2; shift 2
  $LS bench "$@" --url "$url" --workload mixed --num-requests 32 --concurrency 8 --ignore-eos \
    --slo ttft=10000,tpot=250 --out "$OUT/$name-mixed.json" | tee "$OUT/$name-mixed.txt"
  $LS bench "$@" --url "$url" --origin --out "$OUT/$name-origin.json"
}

$LS serve --port 8765 >"$OUT/localserve.log" 2>&1 &
pid=$!
wait_for http://127.0.0.1:8765/healthz
side_by_side localserve ws://127.0.0.1:8765
kill -INT $pid; wait $pid || true

if [ -n "${LLAMA_SERVER:-}" ]; then
  llama_server 8080 >"$OUT/llama-server.log" 2>&1 &
  pid=$!
  wait_for http://127.0.0.1:8080/health
  side_by_side llama-server http://127.0.0.1:8080 --peer http://127.0.0.1:8080
  kill $pid; wait $pid || true
fi
echo "results in $OUT"
