#!/usr/bin/env bash
# Where does localserve stand against llama-server, and against an earlier checkout of itself?
# (issue 14, performance round two) localserve and llama-server side by side on one machine, in
# rounds that alternate which server goes first. The same client (this checkout's `localserve
# bench`) measures every server; each run is a fresh server process unless said otherwise.
#  1. closed-loop chat throughput and tails: `bench --workload chat --max-tokens 96 --ignore-eos`
#     at 1, 8 and 16 users (12, 48, 64 requests): localserve over its websocket protocol (which
#     shares the transcript's preamble as a system prompt), llama-server -b 512 through
#     /v1/completions (its slot cache reuses the previous prompt's preamble: cache_prompt is on
#     by default); one server start per server and round, with a 4-request warm-up;
#  2. the origin scenario (streams, a 3,000-token paste, a late question): localserve over its
#     websocket protocol, llama-server at -b 128, 512 and 2048 (ubatch = batch);
#  3. the mixed workload (32 requests, 8 users, websocket), continuous against static batching;
#  4. the engine against a bare llama_decode loop (`bench-engine --concurrency 1,16 --tokens 96`).
# Then it prints four markdown tables (one per part) from the JSON in OUT (default
# bench-results/compare_llama_server). Figures: docs/benchmarks.md, "Performance, round two
# (issue 14)". Run on a quiet machine:
#   LLAMA_SERVER=/tmp/llama-build/bin/llama-server bash benchmarks/compare_llama_server.sh
# Without LLAMA_SERVER the llama-server runs are skipped. Other settings (environment):
#   ROUNDS=2          rounds; odd rounds run the servers in one order, even rounds in reverse
#   BEFORE=<dir>      also localserve from another checkout, labelled "before", e.g.
#                     git worktree add /tmp/before <commit> && BEFORE=/tmp/before ...
#   PARTS="1 2 3 4"   which parts to run
#   BATCHES="128 512 2048"   llama-server batch sizes for part 2
#   PORT=8765 LLAMA_PORT=8080   the servers' ports
#   TABLES_ONLY=1     print the tables from OUT's JSON, measure nothing
#   SMOKE=1           a plumbing check, not a measurement: 1 round, 2 requests per point, 8
#                     tokens out, localserve alone in part 2, a tiny engine benchmark
# Servers and the client run from this checkout's .venv python (`python -m localserve` from a
# checkout imports that checkout's sources). The ports must be free; a server is always stopped
# (SIGINT for localserve, SIGTERM for llama-server), even when a run fails or the script is
# interrupted, and the next waits until its port is free again.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/common.sh
HERE=$PWD
PY=${PY:-$HERE/.venv/bin/python}
OUT=${OUT:-bench-results/compare_llama_server}
ROUNDS=${ROUNDS:-2}
PARTS=${PARTS:-1 2 3 4}
BATCHES=${BATCHES:-128 512 2048}
BEFORE=${BEFORE:-}
LLAMA_SERVER=${LLAMA_SERVER:-}
PORT=${PORT:-8765}  # localserve's
LLAMA_PORT=${LLAMA_PORT:-8080}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-1800}  # seconds; a run that hangs is stopped and noted

CHAT_TOKENS=96
CHAT_POINTS=("1 12" "8 48" "16 64")  # users, requests
WARMUP_N=4
MIXED=(--concurrency 8 --num-requests 32)
ENGINE=(--concurrency "1,16" --tokens 96)
ORIGIN_LLAMA=1
if [ -n "${SMOKE:-}" ]; then
  ROUNDS=1 CHAT_TOKENS=8 WARMUP_N=2 ORIGIN_LLAMA=
  CHAT_POINTS=("1 2" "2 2")
  MIXED=(--concurrency 2 --num-requests 2 --max-tokens 8 --seed 1)  # seed 1: no paste
  ENGINE=(--concurrency "1,2" --tokens 4)
fi
[ -z "$BEFORE" ] || BEFORE=$(cd "$BEFORE" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# --- servers --------------------------------------------------------------------------------------

SERVER_PID='' SERVER_SIG='' SERVER_PORT=''
TMPD=$(mktemp -d)
trap 'stop_server; rm -rf "$TMPD"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_localserve() {  # dir log [config]: `serve` from that checkout's sources, on $PORT
  local dir=$1 log=$2 config=()
  [ -z "${3:-}" ] || config=(--config "$3")
  wait_free "$PORT" || return 1
  (cd "$dir" && exec "$PY" -m localserve ${config[@]+"${config[@]}"} serve --port "$PORT") \
    >"$log" 2>&1 &
  SERVER_PID=$! SERVER_SIG=INT SERVER_PORT=$PORT
  wait_up "http://127.0.0.1:$PORT/healthz"
}

start_llama() {  # batch log: llama-server (common.sh's settings) with that batch and ubatch
  wait_free "$LLAMA_PORT" || return 1
  llama_server "$LLAMA_PORT" "$1" >"$2" 2>&1 &
  SERVER_PID=$! SERVER_SIG=TERM SERVER_PORT=$LLAMA_PORT
  wait_up "http://127.0.0.1:$LLAMA_PORT/health"
}

start() {  # label log [config]: localserve | before | llama-b<batch>
  case $1 in
    localserve) start_localserve "$HERE" "$2" "${3:-}" ;;
    before) start_localserve "$BEFORE" "$2" "${3:-}" ;;
    llama-b*) start_llama "${1#llama-b}" "$2" ;;
    *) echo "unknown server $1" >&2; return 1 ;;
  esac
}

ordered() {  # round labels...: the labels, one a line, reversed in even rounds
  local round=$1; shift
  if (( round % 2 )); then printf '%s\n' "$@"; else printf '%s\n' "$@" | tac; fi
}

bench() {  # out.json args...: this checkout's client; its output goes next to the JSON
  local out=$1; shift
  rm -f "$out"
  timeout --foreground "$BENCH_TIMEOUT" "$PY" -m localserve bench "$@" --out "$out" \
    >"${out%.json}.txt" 2>&1 || echo "bench failed or incomplete: ${out%.json}.txt" >&2
}

policy_config() {  # dir policy: a copy of that checkout's models.toml with that policy
  local src=${LOCALSERVE_MODELS:-$1/models.toml} dst
  dst=$TMPD/$(basename "$1")-$2.toml
  sed -E 's/^policy = "[a-z]+"/policy = "'"$2"'"/' "$src" >"$dst"
  if [ "$(grep -c "^policy = \"$2\"" "$dst")" != 1 ]; then
    echo "no scheduler policy line to set in $src" >&2
    return 1
  fi
  echo "$dst"
}

# --- the parts ------------------------------------------------------------------------------------


part1() {  # round: closed-loop chat, each server freshly started, warm-up then every point
  local round=$1 label c n point target labels=(localserve)
  [ -z "$BEFORE" ] || labels+=(before)
  [ -z "$LLAMA_SERVER" ] || labels+=(llama-b512)
  mapfile -t labels < <(ordered "$round" "${labels[@]}")
  for label in "${labels[@]}"; do
    target=(--url "ws://127.0.0.1:$PORT")
    [[ $label != llama-* ]] || target=(--peer "http://127.0.0.1:$LLAMA_PORT")
    if start "$label" "$OUT/serve-chat-$label-r$round.log"; then
      bench "$OUT/warmup-chat-$label-r$round.json" "${target[@]}" --workload chat \
        --max-tokens "$CHAT_TOKENS" --ignore-eos \
        --concurrency "$WARMUP_N" --num-requests "$WARMUP_N"
      for point in "${CHAT_POINTS[@]}"; do
        read -r c n <<<"$point"
        bench "$OUT/chat-$label-c$c-r$round.json" "${target[@]}" --workload chat \
          --max-tokens "$CHAT_TOKENS" --ignore-eos --concurrency "$c" --num-requests "$n"
      done
    fi
    stop_server
  done
}

part2() {  # round: the origin scenario, a fresh server for each run
  local round=$1 label batch target labels=(localserve)
  [ -z "$BEFORE" ] || labels+=(before)
  if [ -n "$LLAMA_SERVER" ] && [ -n "$ORIGIN_LLAMA" ]; then
    for batch in $BATCHES; do labels+=("llama-b$batch"); done
  fi
  mapfile -t labels < <(ordered "$round" "${labels[@]}")
  for label in "${labels[@]}"; do
    target=(--url "ws://127.0.0.1:$PORT")
    [[ $label != llama-* ]] || target=(--peer "http://127.0.0.1:$LLAMA_PORT")
    if start "$label" "$OUT/serve-origin-$label-r$round.log"; then
      bench "$OUT/origin-$label-r$round.json" --origin "${target[@]}"
    fi
    stop_server
  done
}

part3() {  # round: the mixed workload on localserve, continuous and static batching
  local round=$1 label which policy dir config labels=(continuous static)
  [ -z "$BEFORE" ] || labels+=(before-continuous before-static)
  mapfile -t labels < <(ordered "$round" "${labels[@]}")
  for label in "${labels[@]}"; do
    which=localserve dir=$HERE policy=$label
    if [[ $label == before-* ]]; then which=before dir=$BEFORE policy=${label#before-}; fi
    config=$(policy_config "$dir" "$policy") || continue
    if start "$which" "$OUT/serve-mixed-$label-r$round.log" "$config"; then
      bench "$OUT/warmup-mixed-$label-r$round.json" --url "ws://127.0.0.1:$PORT" --workload short \
        --max-tokens 16 --concurrency "$WARMUP_N" --num-requests "$WARMUP_N"
      bench "$OUT/mixed-$label-r$round.json" --url "ws://127.0.0.1:$PORT" --workload mixed \
        "${MIXED[@]}" --ignore-eos
    fi
    stop_server
  done
}

part4() {  # round: the engine benchmark, in process, from each checkout's sources
  local round=$1 label dir labels=(localserve)
  [ -z "$BEFORE" ] || labels+=(before)
  mapfile -t labels < <(ordered "$round" "${labels[@]}")
  for label in "${labels[@]}"; do
    dir=$HERE
    [ "$label" != before ] || dir=$BEFORE
    (cd "$dir" && timeout --foreground "$BENCH_TIMEOUT" "$PY" -m localserve bench-engine \
      "${ENGINE[@]}" --out "$OUT/engine-$label-r$round.json") \
      >"$OUT/engine-$label-r$round.txt" 2>&1 ||
      echo "bench-engine failed: $OUT/engine-$label-r$round.txt" >&2
  done
}

if [ -z "${TABLES_ONLY:-}" ]; then
  if compgen -G "$OUT/*.json" >/dev/null; then
    echo "$OUT already holds results: move them away, choose another OUT, or TABLES_ONLY=1" >&2
    exit 1
  fi
  [ -n "$LLAMA_SERVER" ] || echo "LLAMA_SERVER is not set: llama-server is skipped" >&2
  for round in $(seq "$ROUNDS"); do
    for part in $PARTS; do
      echo "round $round, part $part ($(date +%T))" >&2
      "part$part" "$round"
    done
  done
fi

# --- the tables -----------------------------------------------------------------------------------

"$PY" - "$OUT" <<'PY'
import glob
import json
import os
import re
import statistics
import sys

out = sys.argv[1]


def load(pattern):
    """{key groups: {round: JSON}} for the files of OUT whose name matches pattern."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(out, "*.json"))):
        m = re.fullmatch(pattern, os.path.basename(path))
        if not m:
            continue
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        key = tuple(v for k, v in m.groupdict().items() if k != "round")
        runs.setdefault(key, {})[int(m["round"])] = data
    return runs


def order(label):
    """localserve, before, then llama-server by batch; the policies likewise."""
    if label.startswith("llama-b"):
        return (2, int(label[7:]))
    return (1 if label.startswith("before") else 0, label)


def server(label):
    if label.startswith("llama-b"):
        return f"llama-server -b {label[7:]}"
    return {"localserve": "localserve", "before": "localserve (before)"}.get(label, label)


def rounds(by_round, f, sep=" / "):
    """f of each round's JSON, in round order, as 'a / b'; '—' where missing."""
    cells = []
    for r in sorted(by_round):
        try:
            v = f(by_round[r])
        except (KeyError, TypeError, ValueError):
            v = None
        cells.append("—" if v is None else v)
    return sep.join(cells)


def num(v, digits=0):
    return None if v is None else f"{v:,.{digits}f}"


def tails(runs, name):
    """Each round's median / p99 of a summary's timing, rounds separated by commas."""
    s = "summary"
    return rounds(runs, lambda d: f"{d[s][name]['median']:.0f} / {d[s][name]['p99']:.0f}", ", ")


def mean_tput(by_round):
    values = [d["summary"]["output_token_throughput"] for d in by_round.values()]
    return statistics.mean(values) if values else None


def ratio(a, b):
    return f"{a / b:.2f}×" if a and b else "—"


chat = load(r"chat-(?P<label>.+)-c(?P<c>\d+)-r(?P<round>\d+)\.json")
if chat:
    print("## 1. Closed-loop chat (96 tokens out, ignore_eos): localserve over websockets, llama-server over /v1/completions\n")
    print(
        "| users | server | output tok/s (per round) | TTFT p50 / p99 (ms) "
        "| ITL p50 / p99 (ms) | failed | ÷ llama-server (mean tok/s) |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    for c in sorted({int(c) for _, c in chat}):
        llama = chat.get(("llama-b512", str(c)))
        ref = mean_tput(llama) if llama else None
        for label in sorted({lb for lb, cc in chat if int(cc) == c}, key=order):
            runs = chat[(label, str(c))]
            tput = rounds(runs, lambda d: num(d["summary"]["output_token_throughput"], 1))
            failed = sum(d["summary"]["failed"] for d in runs.values())
            rel = "—" if label.startswith("llama") else ratio(mean_tput(runs), ref)
            print(
                f"| {c} | {server(label)} | {tput} | {tails(runs, 'ttft_ms')} "
                f"| {tails(runs, 'itl_ms')} | {failed} | {rel} |"
            )
    print()

origin = load(r"origin-(?P<label>.+)-r(?P<round>\d+)\.json")
if origin:
    print("## 2. The origin scenario (per round)\n")
    print(
        "| server | paste TTFT (ms) | worst stream gap during the paste (ms) "
        "| late question TTFT (ms) | idle question TTFT (ms) | late / idle | all ok |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    for (label,) in sorted(origin, key=lambda k: order(k[0])):
        runs = origin[(label,)]
        cells = [
            rounds(runs, lambda d, k=k: num(d[k]))
            for k in (
                "paste_ttft_ms",
                "worst_stream_gap_during_paste_ms",
                "question_ttft_during_paste_ms",
                "question_ttft_idle_ms",
            )
        ]
        late_idle = lambda d: f"{d['ttft_ratio']:.1f}×" if d["ttft_ratio"] else None  # noqa: E731
        cells.append(rounds(runs, late_idle))
        cells.append(rounds(runs, lambda d: "yes" if d["all_ok"] else "no"))
        print(f"| {server(label)} | " + " | ".join(cells) + " |")
    print()

mixed = load(r"mixed-(?P<label>.+)-r(?P<round>\d+)\.json")
if mixed:
    print("## 3. Mixed workload on localserve (websocket, ignore_eos)\n")
    print(
        "| policy | output tok/s (per round) | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) "
        "| failed | ÷ continuous, this checkout (mean tok/s) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    ref = mean_tput(mixed[("continuous",)]) if ("continuous",) in mixed else None
    for (label,) in sorted(mixed, key=lambda k: order(k[0])):
        runs = mixed[(label,)]
        tput = rounds(runs, lambda d: num(d["summary"]["output_token_throughput"], 1))
        failed = sum(d["summary"]["failed"] for d in runs.values())
        name = label.replace("before-", "") + (" (before)" if label.startswith("before") else "")
        print(
            f"| {name} | {tput} | {tails(runs, 'ttft_ms')} "
            f"| {tails(runs, 'itl_ms')} | {failed} | {ratio(mean_tput(runs), ref)} |"
        )
    print()

engine = load(r"engine-(?P<label>.+)-r(?P<round>\d+)\.json")
if engine:
    rows = {
        (label, r): {row["concurrency"]: row for row in d["decode"]}
        for (label,), by_round in engine.items()
        for r, d in by_round.items()
    }
    cs = sorted({c for decode in rows.values() for c in decode})
    print("## 4. The engine against a bare llama_decode loop\n")
    print(
        "| run | round | "
        + " | ".join(f"{c} seq{'s' * (c > 1)}: engine / bare" for c in cs)
        + f" | {cs[-1]} seqs: engine tok/s |"
    )
    print("|---|---:|" + "---:|" * (len(cs) + 1))
    for (label, r), decode in sorted(rows.items(), key=lambda kv: (kv[0][1], order(kv[0][0]))):
        ratios = [f"{decode[c]['ratio']:.1%}" if c in decode else "—" for c in cs]
        top = decode.get(cs[-1])
        tps = f"{top['engine']['tokens_per_s']:.1f}" if top else "—"
        print(f"| {server(label)} | {r} | " + " | ".join(ratios) + f" | {tps} |")
    print()

if not (chat or origin or mixed or engine):
    print(f"no results in {out}")
PY
