#!/usr/bin/env bash
# What does the engine's process boundary cost, and what does a split over two loopback RPC
# workers cost? (issue 17) Three servers on the embedded model, in alternating rounds on one
# machine:
#   inproc   unsplit, [server] engine_process = false (the engine in the server's process)
#   process  unsplit, engine_process = true (the default: the engine in a supervised child)
#   split    engine_process = true, the layers split over two `localserve worker`s on loopback
#            (--threads 1 each), the main process with n_threads = 1 (three processes, 2 cores)
# Each is benched at 1 user and at 8 users (`bench --workload short --ignore-eos`).
#   bash benchmarks/engine_process_boundary.sh
# Defaults: ROUNDS=4 N1=12 N8=32 TOKENS=64 PORT=8781 (about 9 minutes).
# Four rounds, not two: on a shared machine another process's load stalls runs at random.
# At the end it prints engine_process_boundary_report.py's tables: each run's TTFT, ITL, TPOT,
# tok/s and stalls, then process/inproc, split/process and split/inproc ratios paired within a
# round; again later with
#   .venv/bin/python benchmarks/engine_process_boundary_report.py bench-results/engine_process_boundary
# JSON, bench output and server and worker logs in OUT (default
# bench-results/engine_process_boundary). Figures: docs/benchmarks.md, "The engine process and
# a model split over RPC workers (issue 17)".
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/common.sh
OUT=${OUT:-bench-results/engine_process_boundary}
ROUNDS=${ROUNDS:-4}
N1=${N1:-12}      # requests at 1 user
N8=${N8:-32}      # requests at 8 users
TOKENS=${TOKENS:-64}
PORT=${PORT:-8781}
WORKER_PORTS=(50091 50092)
PY=$PWD/.venv/bin/python
mkdir -p "$OUT"

TMPD=$(mktemp -d)
SERVER_PID=''
PIDS=()  # the servers and workers this script started and has not stopped yet
trap 'stop_all; rm -rf "$TMPD"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- configs --------------------------------------------------------------------------------------

config() {  # name engine_process n_threads [split]: a models.toml in $TMPD; prints its path
  local file=$TMPD/$1.toml
  cat >"$file" <<EOF
default = "gemma-3-270m"
[models.gemma-3-270m]
embedded = true
chat_format = "transcript"
chat_template = "gemma"
n_ctx = 4096
max_num_seqs = 8
max_num_batched_tokens = 256
n_threads = $3
EOF
  if [ -n "${4:-}" ]; then
    cat >>"$file" <<EOF
n_gpu_layers = 12
split_mode = "layer"
tensor_split = [1, 1]
rpc_workers = ["127.0.0.1:${WORKER_PORTS[0]}", "127.0.0.1:${WORKER_PORTS[1]}"]
EOF
  fi
  printf '[server]\nusage = false\nengine_process = %s\n' "$2" >>"$file"
  echo "$file"
}
config inproc false 2 >/dev/null
config process true 2 >/dev/null
config split true 1 split >/dev/null

# --- processes ------------------------------------------------------------------------------------

alive() {  # pid: running (an exited child not yet waited for is a zombie, not alive)
  local stat
  stat=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $stat != Z* ]]
}

listening() { (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_free() {  # port: until nothing accepts connections on it
  for _ in $(seq 120); do listening "$1" || return 0; sleep 0.5; done
  echo "port $1 is still in use" >&2
  return 1
}

stop() {  # pid: SIGINT, 60 s to exit, then SIGKILL
  kill -INT "$1" 2>/dev/null || true
  for _ in $(seq 120); do alive "$1" || break; sleep 0.5; done
  if alive "$1"; then echo "pid $1 ignored SIGINT: killed" >&2; kill -KILL "$1" 2>/dev/null || true; fi
  wait "$1" 2>/dev/null || true
}

stop_all() {  # the server first (it holds connections to the workers), then the workers
  local pid
  for pid in ${PIDS[@]+"${PIDS[@]}"}; do stop "$pid"; done
  PIDS=()
}

start_workers() {  # label: the two RPC workers, until both accept connections
  local port pid
  for port in "${WORKER_PORTS[@]}"; do
    wait_free "$port"
    $LS worker --port "$port" --cache-dir off --threads 1 >"$OUT/worker$port-$1.log" 2>&1 &
    pid=$!
    PIDS=("$pid" ${PIDS[@]+"${PIDS[@]}"})  # stopped after the server
    for _ in $(seq 120); do
      alive "$pid" || { echo "worker $port exited (see its log)" >&2; return 1; }
      listening "$port" && break
      sleep 0.5
    done
  done
}

start_server() {  # name label: `serve` from $TMPD/name.toml on $PORT, until /healthz answers 200
  wait_free "$PORT"
  $LS --config "$TMPD/$1.toml" serve --port "$PORT" >"$OUT/serve-$2.log" 2>&1 &
  local pid=$!
  SERVER_PID=$pid
  PIDS=("$pid" ${PIDS[@]+"${PIDS[@]}"})  # stopped first
  for _ in $(seq 480); do
    alive "$pid" || { echo "the $1 server exited (see $OUT/serve-$2.log)" >&2; return 1; }
    curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "timed out waiting for the $1 server" >&2
  return 1
}

bench() {  # label concurrency requests: one load run, its JSON and its printed summary kept
  $LS bench --url "ws://127.0.0.1:$PORT" --workload short --concurrency "$2" \
    --num-requests "$3" --ignore-eos --max-tokens "$TOKENS" --seed 17 \
    --out "$OUT/$1-c$2.json" >"$OUT/$1-c$2.txt" 2>&1 || echo "bench $1 c$2 failed" >&2
  tail -n 6 "$OUT/$1-c$2.txt" | head -n 2
}

run() {  # name round
  local label=$1-r$2
  echo "== $label ($(date +%T), load average $(cut -d" " -f1 /proc/loadavg))"
  [ "$1" != split ] || start_workers "$label"
  start_server "$1" "$label"
  # warm-up, not recorded: the first decode steps, the transcript preamble's cached KV
  $LS bench --url "ws://127.0.0.1:$PORT" --workload short --concurrency 8 --num-requests 8 \
    --ignore-eos --max-tokens 8 --seed 1 >/dev/null 2>&1 || echo "warm-up $label failed" >&2
  if (( $2 % 2 )); then
    bench "$label" 1 "$N1"; bench "$label" 8 "$N8"
  else
    bench "$label" 8 "$N8"; bench "$label" 1 "$N1"
  fi
  local engine port pid
  engine=$(pgrep -P "$SERVER_PID" || true)  # the supervised engine (process, split)
  stop_all
  for port in "$PORT" "${WORKER_PORTS[@]}"; do wait_free "$port"; done
  for pid in $engine; do
    if alive "$pid"; then echo "engine $pid outlived $label" >&2; fi
  done
  grep -inE "error|traceback|warn" "$OUT/serve-$label.log" | head -n 5 || true
}

for round in $(seq "$ROUNDS"); do
  if (( round % 2 )); then order="inproc process split"; else order="split process inproc"; fi
  for name in $order; do run "$name" "$round"; done
done

"$PY" benchmarks/engine_process_boundary_report.py "$OUT"
