#!/usr/bin/env bash
# Does speculative decoding (n-gram drafts from the prompt) make output faster where the reply
# repeats the prompt, and cost nothing where it does not? (issue 37) localserve with speculation
# on (its default, `[scheduler] speculative = "ngram"`) and off, and llama-server from the same
# llama.cpp without speculation and with its own n-gram modes, in rounds that alternate which
# server goes first. The same client (this checkout's `localserve bench`) measures every server:
# localserve over its websocket protocol, llama-server over /v1/completions (the transcript text,
# so both see the same tokens). Three workloads (localserve/bench/workloads.py):
#   edit   a 1,000-3,000-token slice of pages.md and "repeat the text above word for word, with
#          these corrections: replace "X" with "Y", ..." (words of the slice);
#   quote  a ~1,500-token slice and "summarise this text, quoting its three most important
#          sentences exactly";
#   chat   today's unrelated prompts (short and long questions): speculation should cost nothing;
#   multiturn  the 4th turn of a conversation editing a ~550-token Python file: three earlier
#          turns each asked for a rename and their (ideal) replies repeated the whole file
#          changed; the 4th asks again (issue 52);
#   json   a ~1,000-token page around an order's details and a schema'd extraction of them
#          (`response_format` json_schema; llama-server: `json_schema`): a constrained reply
#          copying values from its prompt. Its replies end where the JSON does (no ignore_eos).
# Each at 1, 4 and 16 users, closed loop (`--concurrency N`), 4, 8 and 32 requests; greedy
# (`--temperature 0`), 256 tokens out with `--ignore-eos` everywhere: the model is a 270M toy that
# may stop early or wander, and fixed lengths keep tokens/s comparable across servers and configs
# (so the edit and quote replies need not really be edits or summaries past their first tokens:
# what is measured is how much of a greedy reply of a prompt like these the drafts get right).
# Every (server, round) is a fresh server process; before each point, 2 warm-up requests of the
# same workload (another seed: no measured prompt is cached before it is measured), and each
# point has a seed of its own, so no point reuses another's prompts; every server sees the same
# prompts.
#
# Both servers get a context of CTX cells (default 65536, not the shipped 8192): 16 users of the
# edit workload hold up to ~55,000 tokens at once, and at 8192 localserve would queue most of
# them and llama-server fail them ("Context size has been exceeded"), measuring the cache's size
# rather than the decoding. localserve's setting is a generated copy of this checkout's
# models.toml (n_ctx = CTX; for "off" one more line under [scheduler], SPEC_OFF_LINE) in a temp
# dir; llama-server is common.sh's `llama_server` (-np 16 -kvu -b 512 ...) with -c CTX, and
# for its speculative runs `--spec-type TYPE` (and LLAMA_SPEC_ARGS), nothing else.
#
# Then a markdown table per workload: a row per server and config, for each of 1, 4 and 16 users
# output tokens/s (mean over rounds) and ITL p50 / p99 (ms; each round's, averaged), the ratio
# speculation on ÷ off (localserve) and n-gram ÷ none (llama-server) at each, failed requests;
# the issue's goals against the figures; and speculation's counters from each server's /metrics
# (llama-server's drafted and accepted tokens; localserve's, if it has any). ITL is the gap between token frames: where a step
# accepts a draft its tokens arrive together, so p50 can fall well below a step's time while p99
# carries the verification steps. From the JSON in OUT (default bench-results/speculative_decoding),
# with each server's log and its /metrics at the end of the run (speculation's counters, where a
# server has them). Run on a quiet machine:
#   LLAMA_SERVER=/tmp/llama-build/bin/llama-server bash benchmarks/speculative_decoding.sh
# (a full run: ~30-40 minutes a round on a 2-core CPU). Without LLAMA_SERVER the llama-server
# runs are skipped. Settings (environment):
#   ROUNDS=2            rounds; odd rounds run the servers in one order, even rounds in reverse
#   FIRST_ROUND=1       the first round to run (a later one adds to OUT's results: a run in parts)
#   WORKLOADS="edit multiturn quote chat json"   USERS="1 4 16"   TOKENS=256
#   PER_USER=2          requests per user of a point (at least 4 a point)
#   LABELS="ls-on ls-off llama-none llama-ngram-simple"   only these (a run in parts, into
#                       the same OUT: the tables read every point's JSON there)
#   SPEC_TYPES="ngram-simple ngram-mod"   llama-server's speculative types, one run each (also:
#                       ngram-map-k, ngram-map-k4v)
#   LLAMA_SPEC_ARGS=""  more llama-server flags for every speculative run, e.g.
#                       "--spec-ngram-simple-size-n 4"; the default is llama-server's own sizes
#                       (this llama.cpp: ngram-simple looks up the last 12 tokens and drafts the
#                       48 that followed them, min hits 1; ngram-mod drafts 48-64)
#   SPEC_ON_LINE=''     a line for the "on" config's [scheduler] (default none: on is default)
#   SPEC_OFF_LINE='speculative = "off"'   the "off" config's line; empty for a checkout that has
#                       no such key (then both configs are the same: a plumbing check only);
#                       both configs are checked (`localserve models`) before anything starts
#   CTX=65536           KV cells, both servers
#   PORT=8765 LLAMA_PORT=8080   the servers' ports
#   PY=.venv/bin/python the python that runs servers and client (`python -m localserve` from
#                       this checkout, PYTHONPATH set to it: this checkout's sources)
#   TABLES_ONLY=1       print the tables from OUT's JSON, measure nothing
#   SMOKE=1             a plumbing check, not a measurement: 1 round, 1 and 2 users, 2 requests
#                       per point, 16 tokens out
# The ports must be free; a server is always stopped (SIGINT for localserve, SIGTERM for
# llama-server), even when a run fails or the script is interrupted, and the next waits until
# its port is free again. No figures yet in docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
HERE=$PWD
PY=${PY:-$HERE/.venv/bin/python}
source benchmarks/common.sh
OUT=${OUT:-bench-results/speculative_decoding}
ROUNDS=${ROUNDS:-2}
WORKLOADS=${WORKLOADS:-edit multiturn quote chat json}
FIRST_ROUND=${FIRST_ROUND:-1}
USERS=${USERS:-1 4 16}
TOKENS=${TOKENS:-256}
SPEC_TYPES=${SPEC_TYPES:-ngram-simple ngram-mod}
LLAMA_SPEC_ARGS=${LLAMA_SPEC_ARGS:-}
SPEC_ON_LINE=${SPEC_ON_LINE-}
SPEC_OFF_LINE=${SPEC_OFF_LINE-speculative = \"off\"}
CTX=${CTX:-65536}
LLAMA_SERVER=${LLAMA_SERVER:-}
PORT=${PORT:-8765}  # localserve's
LLAMA_PORT=${LLAMA_PORT:-8080}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-1800}  # seconds; a run that hangs is stopped and noted
WARMUP_N=2
PER_USER=${PER_USER:-2}
requests() { local n=$((PER_USER * $1)); echo $((n < 4 ? 4 : n)); }  # users -> requests of a point
if [ -n "${SMOKE:-}" ]; then
  ROUNDS=1 USERS="1 2" TOKENS=16
  requests() { echo 2; }
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# --- servers --------------------------------------------------------------------------------------

SERVER_PID='' SERVER_SIG='' SERVER_PORT=''
TMPD=$(mktemp -d)
trap 'stop_server; rm -rf "$TMPD"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

spec_config() {  # on|off: this checkout's models.toml with n_ctx = CTX and that config's line
  local line dst=$TMPD/models-spec-$1.toml
  line=$SPEC_ON_LINE
  [ "$1" = on ] || line=$SPEC_OFF_LINE
  sed -E 's/^n_ctx = [0-9]+/n_ctx = '"$CTX"'/' "${LOCALSERVE_MODELS:-$HERE/models.toml}" >"$dst"
  if [ "$(grep -c "^n_ctx = $CTX\b" "$dst")" != 1 ] || [ "$(grep -c '^\[scheduler\]$' "$dst")" != 1 ]
  then
    echo "models.toml: no single n_ctx line or [scheduler] table to set" >&2
    return 1
  fi
  # the line replaces the key models.toml sets (speculative = ...), or goes under [scheduler]
  if [ -n "$line" ]; then
    local key=${line%% =*}
    sed -i "/^$key = /d" "$dst"
    sed -i "/^\[scheduler\]$/a $line" "$dst"
  fi
  echo "$dst"
}

start_localserve() {  # on|off log: `serve` from this checkout's sources, on $PORT
  local config
  config=$(spec_config "$1") || return 1
  cp "$config" "${2%.log}.toml"
  wait_free "$PORT" || return 1
  # a state directory of its own: the prefix cache's disk tier must not hand one server's
  # prompts to the next (it did: the "off" server's TTFT was 78 ms on prompts the "on" one saved)
  local state
  state=$(mktemp -d "$TMPD/state.XXXXXX")
  (export PYTHONPATH=$HERE LOCALSERVE_STATE_DIR=$state
   exec "$PY" -m localserve --config "$config" serve --port "$PORT") >"$2" 2>&1 &
  SERVER_PID=$! SERVER_SIG=INT SERVER_PORT=$PORT
  wait_up "http://127.0.0.1:$PORT/healthz"
}

llama_args() {  # none|<spec type>: llama-server's flags beyond common.sh's (-c: CTX), one line
  [ "$1" = none ] || echo "--spec-type $1 $LLAMA_SPEC_ARGS"
}

start_llama() {  # none|<spec type> log: common.sh's llama-server, -c CTX, with those flags
  local args
  read -r -a args <<<"$(llama_args "$1")"
  wait_free "$LLAMA_PORT" || return 1
  LLAMA_CTX=$CTX llama_server "$LLAMA_PORT" 512 ${args[@]+"${args[@]}"} >"$2" 2>&1 &
  SERVER_PID=$! SERVER_SIG=TERM SERVER_PORT=$LLAMA_PORT
  wait_up "http://127.0.0.1:$LLAMA_PORT/health"
}

start() {  # label log: ls-on | ls-off | llama-none | llama-<spec type>
  case $1 in
    ls-*) start_localserve "${1#ls-}" "$2" ;;
    llama-*) start_llama "${1#llama-}" "$2" ;;
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
  PYTHONPATH=$HERE timeout --foreground "$BENCH_TIMEOUT" "$PY" -m localserve bench "$@" \
    --out "$out" >"${out%.json}.txt" 2>&1 || echo "bench failed or incomplete: ${out%.json}.txt" >&2
}

# --- a round --------------------------------------------------------------------------------------

run_round() {  # round: every server, freshly started, every workload and point
  local round=$1 label workload c target metrics spec labels=(ls-on ls-off)
  if [ -n "$LLAMA_SERVER" ]; then
    labels+=(llama-none)
    for spec in $SPEC_TYPES; do labels+=("llama-$spec"); done
  fi
  mapfile -t labels < <(ordered "$round" "${labels[@]}")
  for label in "${labels[@]}"; do
    [ -z "${LABELS:-}" ] || [[ " $LABELS " == *" $label "* ]] || continue
    echo "round $round: $label ($(date +%T))" >&2
    target=(--url "ws://127.0.0.1:$PORT") metrics=http://127.0.0.1:$PORT/metrics
    if [[ $label == llama-* ]]; then
      target=(--peer "http://127.0.0.1:$LLAMA_PORT") metrics=http://127.0.0.1:$LLAMA_PORT/metrics
      llama_args "${label#llama-}" >"$OUT/flags-$label.txt"
    fi
    if start "$label" "$OUT/serve-$label-r$round.log"; then
      tr '\0' ' ' <"/proc/$SERVER_PID/cmdline" >"$OUT/cmdline-$label-r$round.txt" || true
      for workload in $WORKLOADS; do
        for c in $USERS; do
          local common=("${target[@]}" --workload "$workload" --temperature 0
            --max-tokens "$TOKENS")
          [ "$workload" = json ] || common+=(--ignore-eos)  # a JSON reply ends where it does
          bench "$OUT/warmup-$workload-$label-c$c-r$round.json" "${common[@]}" \
            --concurrency "$WARMUP_N" --num-requests "$WARMUP_N" --seed $((1000 + c))
          bench "$OUT/$workload-$label-c$c-r$round.json" "${common[@]}" \
            --concurrency "$c" --num-requests "$(requests "$c")" --seed "$c"
        done
      done
      curl -s "$metrics" >"$OUT/metrics-$label-r$round.txt" 2>/dev/null || true
    fi
    stop_server
  done
}

if [ -z "${TABLES_ONLY:-}" ]; then
  if [ "$FIRST_ROUND" = 1 ] && compgen -G "$OUT/*.json" >/dev/null; then
    echo "$OUT already holds results: move them away, choose another OUT, or TABLES_ONLY=1" >&2
    exit 1
  fi
  [ -n "$LLAMA_SERVER" ] || echo "LLAMA_SERVER is not set: llama-server is skipped" >&2
  [ -n "$SPEC_OFF_LINE" ] ||
    echo "SPEC_OFF_LINE is empty: localserve's on and off configs are the same" >&2
  if [ -n "$LLAMA_SERVER" ]; then  # the binary's own defaults of what the flags leave unset
    "$LLAMA_SERVER" --help 2>/dev/null |
      awk '/^-/ { p = ($0 ~ /^--spec-(type|ngram-)/) } p' \
      >"$OUT/llama-spec-defaults.txt" || true
  fi
  for which in on off; do  # a config this checkout refuses (an unknown key) fails here, not later
    config=$(spec_config "$which")
    PYTHONPATH=$HERE "$PY" -m localserve --config "$config" models >/dev/null 2>"$TMPD/check" || {
      echo "localserve refuses the $which config: $(cat "$TMPD/check")" >&2
      echo "(SPEC_OFF_LINE= for a checkout without the speculative key)" >&2
      exit 1
    }
  done
  printf '%s\n' "tokens=$TOKENS" "ctx=$CTX" "spec_on_line=$SPEC_ON_LINE" \
    "spec_off_line=$SPEC_OFF_LINE" "smoke=${SMOKE:-}" >"$OUT/settings.txt"
  for round in $(seq "$FIRST_ROUND" "$ROUNDS"); do run_round "$round"; done
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
WORKLOADS = {
    "edit": "Edit: a 1,000-3,000-token paste repeated with 2-3 corrections",
    "quote": "Summarise and quote: a ~1,500-token paste",
    "chat": "Unrelated prompts (the chat workload: short and long questions)",
    "multiturn": "Multi-turn: the 4th turn editing a file whose 3 versions came before",
    "json": "JSON extraction under a schema: values copied from a ~1,000-token page",
}


def text(name):
    try:
        with open(os.path.join(out, name)) as f:
            return f.read().strip()
    except OSError:
        return ""


settings = dict(line.split("=", 1) for line in text("settings.txt").splitlines() if "=" in line)
runs = {}  # (workload, label, users) -> {round: summary}
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    m = re.fullmatch(r"(\w+)-(ls-\w+|llama-[\w-]+)-c(\d+)-r(\d+)\.json", os.path.basename(path))
    if not m or m[1] not in WORKLOADS:
        continue  # warm-ups and anything else
    try:
        with open(path) as f:
            summary = json.load(f)["summary"]
    except (OSError, ValueError, KeyError):
        continue
    runs.setdefault((m[1], m[2], int(m[3])), {})[int(m[4])] = summary


def order(label):
    """localserve on, off; llama-server none, then its speculative types."""
    return {"ls-on": (0, ""), "ls-off": (1, ""), "llama-none": (2, "")}.get(label, (3, label))


def name(label):
    if label.startswith("ls-"):
        return f"localserve, speculation {label[3:]}"
    flags = " ".join(text(f"flags-{label}.txt").split())
    kind = "no speculation" if label == "llama-none" else label[6:]
    return f"llama-server, {kind}" + (f" (`{flags}`)" if flags else "")


def mean(values):
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def tput(workload, label, users):
    by_round = runs.get((workload, label, users), {})
    return mean([s["output_token_throughput"] for s in by_round.values() if s["completed"]])


def itl(workload, label, users, key):
    by_round = runs.get((workload, label, users), {})
    return mean([s["itl_ms"][key] for s in by_round.values()])


def num(v, digits=0):
    return "—" if v is None else f"{v:,.{digits}f}"


def ratio(a, b):
    return f"{a / b:.2f}×" if a and b else "—"


BASE = {"ls-on": "ls-off"}  # each row's reference for the ratio column
for label in {lb for _, lb, _ in runs}:
    if label.startswith("llama-") and label != "llama-none":
        BASE[label] = "llama-none"

print(
    f"Greedy, {settings.get('tokens', '?')} tokens out (ignore_eos), closed loop; context "
    f"{settings.get('ctx', '?')} cells on both servers; rounds: "
    f"{max((r for v in runs.values() for r in v), default=0)}; localserve's off config adds "
    f"`{settings.get('spec_off_line') or '(nothing)'}` under [scheduler]."
    + (" **SMOKE: a plumbing check, not a measurement.**" if settings.get("smoke") else "")
)
cmdlines = sorted(glob.glob(os.path.join(out, "cmdline-llama-none-r*.txt")))
if cmdlines:
    argv = text(os.path.basename(cmdlines[0])).split()
    flags = " ".join("MODEL" if a.endswith(".gguf") else a for a in argv[1:])
    print(f"\nllama-server (without speculation): `llama-server {flags}`")
# its --help: an option's line, then its description's (wrapped) lines
options = re.split(r"\n(?=-)", text("llama-spec-defaults.txt"))
defaults = [
    f"`{o.split()[0]}` {d[-1]}"
    for o in options
    if any(o.startswith(f"--spec-{label[6:]}-") for _, label, _ in runs)
    and (d := re.findall(r"\(default: ([^)]*)\)", " ".join(o.split())))
]
if defaults:
    print(f"\nllama-server's own defaults for what its flags leave unset (its --help): {', '.join(defaults)}.")
print()

for workload, title in WORKLOADS.items():
    labels = sorted({lb for w, lb, _ in runs if w == workload}, key=order)
    if not labels:
        continue
    users = sorted({c for w, _, c in runs if w == workload})
    print(f"## {title}\n")
    head = "| server | " + " | ".join(
        f"{c} user{'s' * (c > 1)}: tok/s | ITL p50 | ITL p99" for c in users
    )
    at = " / ".join(str(c) for c in users)
    print(head + f" | tok/s ÷ spec off or none ({at} users) | failed |")
    print("|---|" + "---:|" * (3 * len(users)) + "---:|---:|")
    for label in labels:
        cells = []
        for c in users:
            cells += [
                num(tput(workload, label, c), 1),
                num(itl(workload, label, c, "median")),
                num(itl(workload, label, c, "p99")),
            ]
        base = BASE.get(label)
        rel = (
            " / ".join(ratio(tput(workload, label, c), tput(workload, base, c)) for c in users)
            if base
            else ""
        )
        failed = sum(
            s["failed"]
            for (w, lb, _), by_round in runs.items()
            if w == workload and lb == label
            for s in by_round.values()
        )
        print(f"| {name(label)} | " + " | ".join(cells) + f" | {rel} | {failed} |")
    print()

# the issue's goals (52), where the figures are there: on the edit and multi-turn workloads,
# ahead of llama-server's better n-gram mode at every concurrency, >= 1.8x its own speculation
# off at 1 user and 1.25x at 4; unrelated chat >= 0.98x off everywhere
goals = []
for w in ("edit", "multiturn"):
    goals += [
        (f"{w}, 1 user: localserve on ÷ off ≥ 1.8×", w, 1, "ls-on", "ls-off", 1.8),
        (f"{w}, 4 users: localserve on ÷ off ≥ 1.25×", w, 4, "ls-on", "ls-off", 1.25),
    ]
    for c in sorted({c for wl, _, c in runs if wl == w}):
        llamas = [lb for (wl, lb, u) in runs if wl == w and u == c and lb in BASE and lb != "ls-on"]
        best = max(llamas, key=lambda lb: tput(w, lb, c) or 0, default=None)
        if best:
            goals.append((f"{w}, {c} user{'s' * (c > 1)}: localserve on ÷ llama-server's better n-gram mode ({best[6:]}) > 1×", w, c, "ls-on", best, 1.0))
goals += [
    (f"chat, {c} user{'s' * (c > 1)}: localserve on ÷ off ≥ 0.98×", "chat", c, "ls-on", "ls-off", 0.98)
    for c in sorted({c for w, _, c in runs if w == "chat"})
]
rows = []
for title, workload, c, a, b, target in goals:
    x, y = tput(workload, a, c), tput(workload, b, c)
    if x and y:
        met = x / y > target if target == 1.0 else x / y >= target
        rows.append(f"| {title} | {x / y:.2f}× | {'yes' if met else 'no'} |")
if rows:
    print("## The goals (issue 52)\n")
    print("| goal | measured (mean tok/s) | met |")
    print("|---|---:|---|")
    print("\n".join(rows))
    print()

# speculation's counters in each server's /metrics at the end of its run (all workloads, the
# warm-ups too): llama-server's spec_decode_*, and localserve's where it has any
counters = []
for path in sorted(glob.glob(os.path.join(out, "metrics-*-r*.txt"))):
    label, r = re.fullmatch(r"metrics-(.+)-r(\d+)\.txt", os.path.basename(path)).groups()
    lines = [
        line.split()
        for line in text(os.path.basename(path)).splitlines()
        if re.search(r"spec|draft", line) and not line.startswith("#") and "{" not in line
    ]
    values = ", ".join(f"{k.split(':')[-1]} {v}" for k, v, *_ in lines)
    if values:
        counters.append(f"| {name(label)} | {r} | {values} |")
if counters:
    print("## Speculation's counters (/metrics after each run: every workload and warm-up)\n")
    print("| server | round | counters |")
    print("|---|---:|---|")
    print("\n".join(counters))
    print()

if not runs:
    print(f"no results in {out}")
PY
