# Embeddings side by side (issue 41): localserve's /v1/embeddings against llama-server
# --embedding --pooling mean from the same llama.cpp on the same GGUF (the embedded model,
# mean pooled, as localserve pools a chat model), in one run; then a chat stream's ITL on
# localserve alone, beside a large embedding batch, and beside a paste of as many tokens.
#
#   LLAMA_SERVER=/tmp/llama-build/bin/llama-server bash benchmarks/embeddings.sh
#
# Settings (environment): ROUNDS (2: the servers alternate, each round both), CLIENTS ("1 8"),
# INPUTS (16 per request), REQUESTS (4 per client), BATCH (256 inputs beside the stream),
# PORT / LLAMA_PORT (8765 / 8080), OUT (bench-results/embeddings: the JSON lines and the
# servers' logs). Without LLAMA_SERVER only localserve is measured. Both servers get the same
# threads (2), batch (512 tokens per step) and slots (16).
# Figures: docs/benchmarks.md, "Embeddings (issue 41)".
set -euo pipefail
cd "$(dirname "$0")/.."
HERE=$PWD
PY=${PY:-$HERE/.venv/bin/python}
source benchmarks/common.sh
OUT=${OUT:-bench-results/embeddings}
ROUNDS=${ROUNDS:-2}
CLIENTS=${CLIENTS:-1 8}
INPUTS=${INPUTS:-16}
REQUESTS=${REQUESTS:-4}
BATCH=${BATCH:-256}
PORT=${PORT:-8765}
LLAMA_PORT=${LLAMA_PORT:-8080}
LLAMA_SERVER=${LLAMA_SERVER:-}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
TMPD=$(mktemp -d)
trap 'stop_server; rm -rf "$TMPD"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
client() { PYTHONPATH=$HERE "$PY" benchmarks/embeddings_client.py "$@" | tee -a "$OUT/results.jsonl"; }

start_localserve() {
  wait_free "$PORT"
  (export PYTHONPATH=$HERE LOCALSERVE_STATE_DIR=$TMPD/state
   exec "$PY" -m localserve serve --port "$PORT") >"$OUT/localserve.log" 2>&1 &
  SERVER_PID=$! SERVER_SIG=INT SERVER_PORT=$PORT
  wait_up "http://127.0.0.1:$PORT/healthz"
}

start_llama() {
  wait_free "$LLAMA_PORT"
  llama_server "$LLAMA_PORT" 512 --embedding --pooling mean >"$OUT/llama-server.log" 2>&1 &
  SERVER_PID=$! SERVER_SIG=TERM SERVER_PORT=$LLAMA_PORT
  wait_up "http://127.0.0.1:$LLAMA_PORT/health"
}

: >"$OUT/results.jsonl"
for round in $(seq "$ROUNDS"); do
  echo "round $round" >&2
  start_localserve
  # shellcheck disable=SC2086
  client throughput "http://127.0.0.1:$PORT" localserve --clients $CLIENTS --inputs "$INPUTS" \
    --requests "$REQUESTS"
  stop_server
  if [ -n "$LLAMA_SERVER" ]; then
    start_llama
    # shellcheck disable=SC2086
    client throughput "http://127.0.0.1:$LLAMA_PORT" llama-server --clients $CLIENTS \
      --inputs "$INPUTS" --requests "$REQUESTS"
    stop_server
  fi
done
start_localserve
client itl "http://127.0.0.1:$PORT" localserve --batch "$BATCH"
stop_server
