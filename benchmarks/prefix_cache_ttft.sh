#!/usr/bin/env bash
# How much does prefix caching cut a returning user's TTFT? (issue 6) The TTFT of turn 5 of a
# conversation with ~2,000 tokens of history, with and without reuse, and the same against
# llama-server. Run on a quiet machine:
#   bash benchmarks/prefix_cache_ttft.sh   (LLAMA_SERVER=/path/to/llama-server for another build)
# Each conversation reads localserve/data/pages.md part by part (~350 tokens a turn plus a
# question), resending the whole history each turn; greedy, replies of at most 64 tokens.
#   1. `localserve serve` (prefix caching on), then each last turn replayed cold (`--cold`:
#      as another user, who may not reuse the conversation's cells) — with/without in one run;
#   2. `localserve serve --no-prefix-cache`: every turn prefills its whole prompt;
#   3. llama-server with common.sh's flags (it keeps each slot's prompt: `cache_prompt` is on
#      by default), the cold replay with `cache_prompt: false`; skipped if LLAMA_SERVER (default
#      /tmp/llama-build/bin/llama-server) is not there.
# Settings: CONVERSATIONS (4), TURNS (5), OUT (bench-results/prefix_cache_ttft). Prints each
# run's per-turn summary, then a table of the last turn's TTFT (with reuse, without, cold, and
# llama-server's) and whether turn 5 with reuse took at most 30% of without; the table also goes
# to OUT/summary.md, the runs' JSON, logs and the cached run's /metrics counters beside it.
# Figures: docs/benchmarks.md, "Prefix caching: multi-turn TTFT (issue 6)".
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench-results/prefix_cache_ttft}
LS=.venv/bin/localserve
CONVERSATIONS=${CONVERSATIONS:-4}
TURNS=${TURNS:-5}
LLAMA_SERVER=${LLAMA_SERVER:-/tmp/llama-build/bin/llama-server}
MODEL=$(.venv/bin/python -c "from localserve.runners.models import ensure_embedded; print(ensure_embedded())")
mkdir -p "$OUT"

pid=
stop_server() { [ -n "$pid" ] && { kill -INT "$pid" 2>/dev/null || true; wait "$pid" || true; }; pid=; }
trap stop_server EXIT

wait_for() {  # wait until an HTTP endpoint answers
  for _ in $(seq 120); do curl -sf "$1" >/dev/null 2>&1 && return 0; sleep 0.5; done
  echo "timed out waiting for $1" >&2; return 1
}

conversation() {  # name [bench options...]
  local name=$1; shift
  echo "== $name"
  $LS bench "$@" --workload conversation --conversations "$CONVERSATIONS" --turns "$TURNS" \
    --out "$OUT/$name.json" | tee "$OUT/$name.txt" || echo "$name: some conversations failed" >&2
}

# 1. and 2. localserve with and without prefix caching
$LS serve --port 8765 >"$OUT/localserve-cache.log" 2>&1 &
pid=$!
wait_for http://127.0.0.1:8765/healthz
conversation localserve-cache --url ws://127.0.0.1:8765 --cold
curl -s http://127.0.0.1:8765/metrics | grep -E '^localserve:(prefill|prefix_cache_hit|prompt)_tokens_total' \
  >"$OUT/localserve-cache.metrics" || true
stop_server

$LS serve --port 8765 --no-prefix-cache >"$OUT/localserve-nocache.log" 2>&1 &
pid=$!
wait_for http://127.0.0.1:8765/healthz
conversation localserve-nocache --url ws://127.0.0.1:8765
stop_server

# 3. llama-server, same model, context, slots, threads and batch
if [ -x "$LLAMA_SERVER" ]; then
  "$LLAMA_SERVER" -m "$MODEL" -c 8192 -np 16 -kvu -t 2 -tb 2 -b 512 -ub 512 --metrics \
    --cache-ram 0 --no-jinja --chat-template gemma --no-repack --port 8080 >"$OUT/llama-server.log" 2>&1 &
  pid=$!
  wait_for http://127.0.0.1:8080/health
  conversation llama-server --peer http://127.0.0.1:8080 --cold
  stop_server
else
  echo "no llama-server at $LLAMA_SERVER: skipped" >&2
fi

# the last turn's TTFT, side by side (also in summary.md)
.venv/bin/python - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import json, pathlib, sys

out = pathlib.Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text())["summary"]
        for p in sorted(out.glob("*.json")) if p.stem != "summary"}
fmt = lambda v, f="{:.0f}": "–" if v is None else f.format(v)
print("| run | turn | prompt tokens | cached tokens | TTFT median (ms) | TTFT mean (ms) "
      "| cold TTFT median (ms) | ratio to cold |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for name, s in runs.items():
    last, row = s["last_turn"], s["turns"][-1] if s["turns"] else None
    if not last or not row:
        print(f"| {name} | – | | | | | | |")
        continue
    print(f"| {name} | {last['turn']} | {fmt(row['prompt_tokens']['mean'])} "
          f"| {fmt(row['cached_tokens']['mean'])} | {fmt(last['ttft_median_ms'])} "
          f"| {fmt(last['ttft_mean_ms'])} | {fmt(last['cold_ttft_median_ms'])} "
          f"| {fmt(last['ratio_to_cold'], '{:.0%}')} |")
cache, nocache = runs.get("localserve-cache"), runs.get("localserve-nocache")
if cache and nocache and cache["last_turn"] and nocache["last_turn"]:
    a, b = cache["last_turn"]["ttft_median_ms"], nocache["last_turn"]["ttft_median_ms"]
    if a and b:
        verdict = "met" if a / b <= 0.30 else "missed"
        print(f"\nlocalserve turn {cache['last_turn']['turn']} TTFT median with reuse / without "
              f"(--no-prefix-cache): {a:.0f} / {b:.0f} ms = {a / b:.0%} (goal <= 30%: {verdict})")
EOF
echo "results in $OUT"
