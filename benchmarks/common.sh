# Shared by the benchmark scripts (sourced from the repository root).
LS=.venv/bin/localserve
MODEL=$(.venv/bin/python -c "from localserve.models import ensure_embedded; print(ensure_embedded())")

wait_for() {  # wait until an HTTP endpoint answers
  for _ in $(seq 240); do curl -sf "$1" >/dev/null 2>&1 && return 0; sleep 0.5; done
  echo "timed out waiting for $1" >&2; return 1
}

llama_server() {  # port: llama-server on the embedded model, with localserve's serve settings
  "$LLAMA_SERVER" -m "$MODEL" -c 8192 -np 16 -kvu -t 2 -tb 2 -b 512 -ub 512 --metrics \
    --cache-ram 0 --no-jinja --chat-template gemma --no-repack --port "$1"
}
