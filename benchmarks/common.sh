# Shared by the benchmark scripts: `source benchmarks/common.sh` from the repository root.
# Measures nothing itself. It sets LS (the checkout's localserve command) and MODEL (the
# embedded model's GGUF, assembled if missing, by $PY if set, else .venv/bin/python), and
# defines wait_for URL (until an HTTP endpoint answers, 2 minutes at most) and llama_server PORT
# [BATCH [FLAGS...]] (llama-server on that model with localserve's serve settings, then FLAGS;
# needs LLAMA_SERVER, the path of a llama-server binary; LLAMA_CTX, default 8192, its -c).
LS=.venv/bin/localserve
MODEL=$("${PY:-.venv/bin/python}" -c "from localserve.runners.models import ensure_embedded; print(ensure_embedded())")

wait_for() {  # wait until an HTTP endpoint answers
  for _ in $(seq 240); do curl -sf "$1" >/dev/null 2>&1 && return 0; sleep 0.5; done
  echo "timed out waiting for $1" >&2; return 1
}

# port [batch, default 512 = models.toml's max_num_batched_tokens; ubatch the same] [flags...]:
# llama-server on the embedded model, with localserve's serve settings (-c: LLAMA_CTX, default
# 8192 = models.toml's n_ctx), then the flags (e.g. --spec-type ngram-simple). Start it in the
# background
# (`llama_server 8080 >log 2>&1 &`): it execs, so $! is llama-server itself and `kill $!` stops
# it (without exec, the kill reached only the function's subshell and left llama-server running).
llama_server() {
  local batch=${2:-512}
  exec "$LLAMA_SERVER" -m "$MODEL" -c "${LLAMA_CTX:-8192}" -np 16 -kvu -t 2 -tb 2 -b "$batch" \
    -ub "$batch" --metrics --cache-ram 0 --no-jinja --chat-template gemma --no-repack --port "$1" "${@:3}"
}

# One server at a time, started by the script into SERVER_PID (its stop signal SERVER_SIG, its
# port SERVER_PORT): alive PID, wait_free PORT, wait_up URL (fails at once if it exited),
# stop_server (its signal, 60 s, then SIGKILL; then until its port is free).
SERVER_PID='' SERVER_SIG='' SERVER_PORT=''

alive() {  # pid: running (an exited child not yet waited for is a zombie, not alive)
  local stat
  stat=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $stat != Z* ]]
}

wait_free() {  # port: until nothing accepts connections on it
  for _ in $(seq 120); do
    (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null || return 0
    sleep 0.5
  done
  echo "port $1 is still in use" >&2
  return 1
}

wait_up() {  # url: until the server answers it; fails at once if the server has exited
  for _ in $(seq 240); do
    alive "$SERVER_PID" || { echo "the server exited (see its log)" >&2; return 1; }
    curl -sf "$1" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "timed out waiting for $1" >&2
  return 1
}

stop_server() {  # the running server, if any: its signal, 60 s to exit, then SIGKILL
  [ -n "$SERVER_PID" ] || return 0
  kill -"$SERVER_SIG" "$SERVER_PID" 2>/dev/null || true
  for _ in $(seq 120); do alive "$SERVER_PID" || break; sleep 0.5; done
  kill -KILL "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=''
  wait_free "$SERVER_PORT" || true
}
