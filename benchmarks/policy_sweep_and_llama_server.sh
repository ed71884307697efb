#!/usr/bin/env bash
# The first-party experiment (docs/benchmarks.md): sweeps, continuous vs static, and llama-server
# side by side on the same model, threads, slots and context. Run on a quiet machine:
#   LLAMA_SERVER=/path/to/llama-server bash benchmarks/policy_sweep_and_llama_server.sh
# llama-server is built from the llama.cpp sources vendored in the llama-cpp-python 0.3.36
# source package (see docs/benchmarks.md for the exact commands).
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/common.sh
OUT=${OUT:-bench-results}
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
