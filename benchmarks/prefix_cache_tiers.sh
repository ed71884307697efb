#!/usr/bin/env bash
# Do people taking turns in long conversations ever pay a full prefill again? (issue 48: the
# prefix cache in tiers, KV cells -> host memory -> disk.) Run on a quiet machine:
#   bash benchmarks/prefix_cache_tiers.sh          (SMOKE=1: 2 people, 2 rounds, short texts)
# The workload (client: benchmarks/prefix_cache_tiers.py, whose docstring says more): N people,
# each with one conversation whose first turn is ~1,450 tokens of localserve/bench/data/pages.md
# (a slice of its own) and a question, then ROUNDS rounds in rotation, one request at a time,
# each turn the whole history and a ~20-token question, greedy, 32 tokens at most; every turn is
# followed at once by the same person's follow-up (the "warm" control). TTFT on the client.
# For each N in PEOPLE (8 16 32; 8 x ~1,500 tokens is more than the 8,192 KV cells), in turn:
#   localserve                   `serve`, the tiers on (models.toml's budgets: auto)
#   localserve-no-tiers          host_cache_mib = 0, disk_cache_mib = 0: the old behaviour
#   llama-server                 common.sh's flags, then --cache-ram $LLAMA_CACHE_RAM (8192 MiB,
#                                its default: `llama-server --help`; the later flag wins)
#   llama-server-cram0           common.sh's flags as they are (--cache-ram 0)
# then restart-$RESTART_PEOPLE (localserve: round 1, a graceful stop (SIGINT), a start on the
# same state dir, the other rounds: the disk tier) and itl (localserve: a 200-token stream alone,
# beside 8 resumed conversations that left the cells, alone again; its gaps against
# itl_target_ms). Each localserve run gets a fresh state dir (LOCALSERVE's disk tier:
# <state_dir>/kv-cache) and a models.toml copied from the checkout's with n_ctx = N_CTX.
# Settings: PEOPLE, ROUNDS (4), WORDS (1250, ~1,450 tokens with the question), N_CTX (8192, also
# llama-server's -c), CONFIGS (the four above), RESTART_PEOPLE (8, "" = skip), ITL_OTHERS (8,
# 0 = skip), ITL_FILLERS (8), STREAM_TOKENS (200), LLAMA_SERVER (/tmp/llama-build/bin/
# llama-server; its runs are skipped without it), OUT (bench-results/prefix_cache_tiers).
# Prints each round's TTFT and cached tokens as it goes, then the tables and goals (also in
# OUT/summary.md); each run's JSON (every turn, RSS and /metrics after each round) and server
# log beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/common.sh
if [ "${SMOKE:-0}" = 1 ]; then
  PEOPLE=${PEOPLE:-2} ROUNDS=${ROUNDS:-2} WORDS=${WORDS:-150} RESTART_PEOPLE=${RESTART_PEOPLE-2}
  ITL_OTHERS=${ITL_OTHERS:-2} ITL_FILLERS=${ITL_FILLERS:-1} STREAM_TOKENS=${STREAM_TOKENS:-40}
fi
PEOPLE=${PEOPLE:-8 16 32}
ROUNDS=${ROUNDS:-4}
WORDS=${WORDS:-1250}
N_CTX=${N_CTX:-8192}
CONFIGS=${CONFIGS:-localserve localserve-no-tiers llama-server llama-server-cram0}
RESTART_PEOPLE=${RESTART_PEOPLE-8}
ITL_OTHERS=${ITL_OTHERS:-8} ITL_FILLERS=${ITL_FILLERS:-8} STREAM_TOKENS=${STREAM_TOKENS:-200}
LLAMA_SERVER=${LLAMA_SERVER:-/tmp/llama-build/bin/llama-server}
LLAMA_CACHE_RAM=${LLAMA_CACHE_RAM:-8192}
OUT=${OUT:-bench-results/prefix_cache_tiers}
export LLAMA_CTX=$N_CTX
CLIENT=(.venv/bin/python benchmarks/prefix_cache_tiers.py)
LS_PORT=8765 LLAMA_PORT=8080
rm -rf "$OUT" && mkdir -p "$OUT"
tmp=$(mktemp -d)  # the models.toml copies, the state dirs (the disk tier can be large)
trap 'stop_server; rm -rf "$tmp"' EXIT

"${CLIENT[@]}" models-toml --n-ctx "$N_CTX" --out "$tmp/tiers.toml" | tee -a "$OUT/notes.txt"
"${CLIENT[@]}" models-toml --n-ctx "$N_CTX" --no-tiers --out "$tmp/no-tiers.toml" \
  | tee -a "$OUT/notes.txt"

start_localserve() {  # name models.toml state_dir
  $LS serve --port $LS_PORT --config "$2" --state-dir "$3" >>"$OUT/$1.log" 2>&1 &
  SERVER_PID=$! SERVER_SIG=INT SERVER_PORT=$LS_PORT
  wait_up http://127.0.0.1:$LS_PORT/healthz
}

start_llama_server() {  # name [flags...]
  llama_server $LLAMA_PORT 512 "${@:2}" >"$OUT/$1.log" 2>&1 &
  SERVER_PID=$! SERVER_SIG=TERM SERVER_PORT=$LLAMA_PORT
  wait_up http://127.0.0.1:$LLAMA_PORT/health
}

start() {  # config name: starts it, sets URL and DISK_DIR; fails (1) when it cannot be run
  local state=$tmp/state-$2
  URL=http://127.0.0.1:$LS_PORT DISK_DIR=$state/kv-cache
  case $1 in
    localserve) start_localserve "$2" "$tmp/tiers.toml" "$state" ;;
    localserve-no-tiers) start_localserve "$2" "$tmp/no-tiers.toml" "$state" ;;
    llama-server*)
      [ -x "$LLAMA_SERVER" ] || { echo "no llama-server at $LLAMA_SERVER: $2 skipped" >&2; return 1; }
      URL=http://127.0.0.1:$LLAMA_PORT DISK_DIR=
      if [ "$1" = llama-server ]; then start_llama_server "$2" --cache-ram "$LLAMA_CACHE_RAM"
      else start_llama_server "$2"; fi ;;
  esac
}

rotation() {  # name [client options...]
  "${CLIENT[@]}" rotation --url "$URL" --pid "$SERVER_PID" --disk-dir "$DISK_DIR" \
    --words "$WORDS" --rounds "$ROUNDS" --out "$OUT/$1.json" "${@:2}" \
    || echo "$1: the rotation failed (see $OUT/$1.log)" | tee -a "$OUT/notes.txt" >&2
}

# the rotation: each N, the configurations one after another
for n in $PEOPLE; do
  for config in $CONFIGS; do
    echo "== $config-$n"
    start "$config" "$config-$n" || { stop_server; continue; }
    rotation "$config-$n" --people "$n"
    stop_server
  done
done
# the flags as llama-server read them: "specified multiple times ... only last value will be
# used", and with --cache-ram 0 "--cache-idle-slots requires --cache-ram, disabling"
for log in "$OUT"/llama-server-*.log; do
  [ -e "$log" ] || continue
  { grep -i "cache.ram" "$log" | head -2; grep -i "cache state" "$log" | tail -1; } \
    | sed "s|^|$(basename "$log"): |" >>"$OUT/notes.txt" || true
done

# the restart: round 1, a graceful stop, the same state dir, the other rounds
if [ -n "$RESTART_PEOPLE" ]; then
  name=restart-$RESTART_PEOPLE
  echo "== $name"
  start localserve "$name"
  rotation "$name" --people "$RESTART_PEOPLE" --phase first --conversations "$tmp/$name.json"
  stop_server
  echo "disk tier after the stop: $(du -sh "$DISK_DIR" 2>/dev/null || echo "no $DISK_DIR")" \
    | tee -a "$OUT/notes.txt"
  start localserve "$name"
  rotation "$name" --people "$RESTART_PEOPLE" --phase resume --conversations "$tmp/$name.json"
  stop_server
fi

# a stream's ITL while conversations are restored beside it
if [ "$ITL_OTHERS" -gt 0 ]; then
  echo "== itl"
  start localserve itl
  "${CLIENT[@]}" itl --url "$URL" --pid "$SERVER_PID" --disk-dir "$DISK_DIR" --words "$WORDS" \
    --others "$ITL_OTHERS" --fillers "$ITL_FILLERS" --stream-tokens "$STREAM_TOKENS" \
    --out "$OUT/itl.json" || echo "itl: failed (see $OUT/itl.log)" | tee -a "$OUT/notes.txt" >&2
  stop_server
fi

"${CLIENT[@]}" report "$OUT" | tee "$OUT/summary.md"
echo "results in $OUT"
