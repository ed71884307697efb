#!/usr/bin/env bash
# One prepared GPU benchmark (issue 12): everything localserve measures, on llama.cpp's CUDA
# backend, side by side with llama-server from the same build. Results (JSON and summary.md)
# go to OUTDIR.
#
#   GPU=cuda bash benchmarks/gpu.sh OUTDIR     # a machine with an NVIDIA GPU and nvcc
#   GPU=cpu  bash benchmarks/gpu.sh OUTDIR     # the same end to end on the CPU (the proof it runs)
#
# Steps: (1) build the llama.cpp that llama-cpp-python vendors — libllama and llama-server from
# one build, for the one GPU architecture present (CMAKE_CUDA_ARCHITECTURES=native), and point
# llama-cpp-python at it with LLAMA_CPP_LIB_PATH; (2) the model: $MODEL, else the embedded one,
# else one of the same shapes with random weights made from $META (scripts/random_gguf.py: speed
# and memory depend on shapes, not values — the summary says so); (3) `localserve bench-engine`
# against the bare llama_decode loop, and what a draft row costs (benchmarks/draft_row_cost.py:
# speculation's ceiling, issue 52); (4) a short continuous-vs-static sweep; (5) localserve
# and llama-server, each serving the same model, context (8192), slots (16) and batch (512):
# the origin scenario and 16 users of short questions through the same client.
# Prints the build's system info and progress lines; summary.md holds two tables (engine / bare
# per concurrency; each server's throughput, TTFT, ITL and origin figures). Figures:
# docs/benchmarks.md, "The prepared GPU benchmark (issue 12)".
#
# Inputs (environment): LLAMA_SRC (llama.cpp sources; default: the vendor/llama.cpp of the
# llama-cpp-python source package, from pip's download), BUILD (build directory, reused when it
# exists; default OUTDIR/build), MODEL or META, JOBS (default: all cores), PY and LS (the
# environment's python and localserve; default .venv/bin). Nothing is fetched.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: GPU=cuda|cpu bash benchmarks/gpu.sh OUTDIR" >&2; exit 2; }
OUT=$(realpath -m "$1")
cd "$(dirname "$0")/.."
GPU=${GPU:-cuda}
PY=${PY:-.venv/bin/python}
LS=${LS:-.venv/bin/localserve}
BUILD=${BUILD:-$OUT/build}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
say() { echo "[gpu.sh $(date +%T)] $*" | tee -a "$OUT/log.txt"; }
wait_for() {  # wait until an HTTP endpoint answers
  for _ in $(seq 600); do curl -sf "$1" >/dev/null 2>&1 && return 0; sleep 0.5; done
  say "timed out waiting for $1"; return 1
}

# --- 1. one llama.cpp build for both sides --------------------------------------------------
if [ -z "${LLAMA_SRC:-}" ]; then
  src=$(mktemp -d)
  $PY -m pip download --no-deps --no-binary :all: -d "$src" llama-cpp-python==0.3.36 -q
  tar xzf "$src"/llama_cpp_python-0.3.36.tar.gz -C "$src"
  LLAMA_SRC="$src/llama_cpp_python-0.3.36/vendor/llama.cpp"
fi
flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
       -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF)
ngl=0
if [ "$GPU" = cuda ]; then
  flags+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native)
  ngl=99
fi
say "building llama.cpp ($GPU) in $BUILD with $JOBS jobs"
start=$SECONDS
cmake -S "$LLAMA_SRC" -B "$BUILD" "${flags[@]}" >"$OUT/build.log" 2>&1
cmake --build "$BUILD" --target llama llama-server -j "$JOBS" >>"$OUT/build.log" 2>&1
say "built in $((SECONDS - start)) s"
export LLAMA_CPP_LIB_PATH="$BUILD/bin"  # llama-cpp-python loads this libllama
$PY -c "import llama_cpp; assert llama_cpp.llama_supports_gpu_offload() == ('$GPU' == 'cuda'), \
  'the build does not match GPU=$GPU'; print(llama_cpp.llama_print_system_info().decode())" \
  | tee -a "$OUT/log.txt"

# --- 2. the model ------------------------------------------------------------------------------
random=false
if [ -z "${MODEL:-}" ]; then
  if [ -n "${META:-}" ]; then
    MODEL="$OUT/random.gguf"
    random=true
    [ -f "$MODEL" ] || $PY scripts/random_gguf.py "$META" "$MODEL" --gguf-py "$LLAMA_SRC/gguf-py"
  else
    MODEL=$($PY -c "from localserve.runners.models import ensure_embedded; print(ensure_embedded())")
  fi
fi
cat >"$OUT/models.toml" <<EOF
default = "bench"
[models.bench]
path = "$MODEL"
chat_format = "transcript"
chat_template = "gemma"
n_ctx = 8192
max_num_seqs = 16
max_num_batched_tokens = 512
n_gpu_layers = -1
EOF
export LOCALSERVE_MODELS="$OUT/models.toml"
say "model $MODEL (random weights: $random)"

# --- 3-4. the engine against bare llama_decode; continuous vs static --------------------------
$LS bench-engine --concurrency 1,4,16 --tokens 64 --out "$OUT/engine.json" >"$OUT/engine.txt" 2>&1
say "bench-engine done"
MODEL="$MODEL" NGL=$ngl $PY benchmarks/draft_row_cost.py >"$OUT/draft_rows.txt" 2>"$OUT/draft_rows.log"
say "draft rows done"  # what speculation's kept tokens cost here (issue 52)
$LS sweep --workloads short --concurrency 1,16 --num-requests 32 --out-dir "$OUT/sweep" \
  >"$OUT/sweep.txt" 2>&1
say "sweep done"

# --- 5. localserve and llama-server, the same client ------------------------------------------
side() {  # name url [bench args...]: the origin scenario and 16 users of short questions
  local name=$1 url=$2; shift 2
  $LS bench "$@" --url "$url" --origin --out "$OUT/$name-origin.json" >/dev/null 2>&1
  $LS bench "$@" --url "$url" --workload short --num-requests 64 --concurrency 16 \
    --ignore-eos --out "$OUT/$name-short.json" >/dev/null 2>&1
  say "$name done"
}
$LS serve --port 8791 >"$OUT/localserve.log" 2>&1 &
pid=$!
wait_for http://127.0.0.1:8791/healthz
side localserve ws://127.0.0.1:8791
kill -INT $pid; wait $pid || true
"$BUILD/bin/llama-server" -m "$MODEL" -c 8192 -np 16 -kvu -b 512 -ub 512 -ngl $ngl \
  --metrics --cache-ram 0 --no-jinja --chat-template gemma --no-repack --port 8792 \
  >"$OUT/llama-server.log" 2>&1 &
pid=$!
wait_for http://127.0.0.1:8792/health
side llama-server http://127.0.0.1:8792 --peer http://127.0.0.1:8792
kill $pid; wait $pid || true

# --- the summary ---------------------------------------------------------------------------------
$PY - "$OUT" "$GPU" "$random" <<'PY' | tee "$OUT/summary.md"
import json, pathlib, sys
out, gpu, random = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "true"
engine = json.loads((out / "engine.json").read_text())
machine = engine["machine"]
print(f"# localserve with llama.cpp's {machine['runner']['backend']} backend ({gpu} build)\n")
print(f"CPU: {machine['cpu']}, {machine['cores']} cores. What runs where:\n")
print("```\n" + machine["where"] + "\n```\n")
if random:
    print("Model: the embedded model's shapes and tokenizer with random Q8_0 weights (speed and "
          "memory depend on shapes, not values; Q8_0 matrices cost a little more than Q4_K_M).\n")
print("| sequences | bare llama_decode tok/s | engine tok/s | engine / bare |")
print("|---:|---:|---:|---:|")
for row in engine["decode"]:
    print(f"| {row['concurrency']} | {row['bare_tokens_per_s']:.0f} | "
          f"{row['engine']['tokens_per_s']:.0f} | {row['ratio']:.1%} |")
print("\n| server | output tok/s, 16 users | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | origin: "
      "worst stream gap (ms) | late question TTFT / idle (ms) | paste TTFT (ms) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name in ("localserve", "llama-server"):
    s = json.loads((out / f"{name}-short.json").read_text())["summary"]
    o = json.loads((out / f"{name}-origin.json").read_text())
    num = lambda v: "–" if v is None else f"{v:.0f}"  # noqa: E731
    print(f"| {name} | {s['output_token_throughput']:.0f} | {num(s['ttft_ms']['median'])} / "
          f"{num(s['ttft_ms']['p99'])} | {num(s['itl_ms']['median'])} / {num(s['itl_ms']['p99'])} | "
          f"{num(o['worst_stream_gap_during_paste_ms'])} | {num(o['question_ttft_during_paste_ms'])} / "
          f"{num(o['question_ttft_idle_ms'])} | {num(o['paste_ttft_ms'])} |")
print("\nA decode step of N sequences with k draft rows each, all with logits (ms; "
      "benchmarks/draft_row_cost.py: sequences, k, median):\n")
print("```\n" + (out / "draft_rows.txt").read_text() + "```")
print(f"\nSweep (continuous vs static): {out / 'sweep'}; logs and JSON in {out}.")
PY
say "all done: $OUT/summary.md"
