"""What does a second model cost in memory, and does it come back when the model is unloaded;
how long is the first token of a cold model, a warm one and a swapped one?

Serves the embedded GGUF under two names ("gemma", the default, and "small", n_ctx 1024) with
`serving()` on loopback, and reads VmRSS from /proc for the server's process and for each
engine process: before "small" loads, while it is loaded, and after its keep_alive (2 s) has
unloaded it. Then, with max_loaded_models = 1, the time to first token over the OpenAI API
(streamed) of: a cold model (its first request loads it), the same model warm, and a model that
must first evict the other (swapped). Prints a table. Run from the repository root:

    .venv/bin/python benchmarks/model_swap_memory.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from pathlib import Path

from localserve.config import Config, ModelConfig, ServerConfig
from localserve.runners.models import ensure_embedded
from localserve.serve.serving import serving

SETTINGS = dict(
    chat_format="transcript", chat_template="gemma", max_num_batched_tokens=256, n_threads=2
)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def config(**server) -> Config:
    gguf = ensure_embedded()
    models = {
        "gemma": ModelConfig(embedded=True, n_ctx=2048, keep_alive=-1, **SETTINGS),
        "small": ModelConfig(path=str(gguf), n_ctx=1024, keep_alive=2, **SETTINGS),
    }
    return Config(default="gemma", models=models, server=ServerConfig(usage=False, **server))


def ttft_ms(http: str, model: str) -> float:
    """The first streamed content chunk's arrival, from the request's start."""
    body = {"model": model, "stream": True, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "Hello"}]}  # fmt: skip
    headers = {"Content-Type": "application/json"}
    url = http + "/v1/chat/completions"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=300) as response:
        for line in response:
            if b'"content":"' in line and b'"content":""' not in line:
                first = time.perf_counter()
                response.read()
                return (first - started) * 1e3
    return float("nan")


def memory() -> None:
    import os

    with serving(config(), thread=True) as served:
        pool, http = served.server.pool, served.thread.http
        child = lambda name: pool.slot(name).engine._process.pid  # noqa: E731
        rows = [("before small loads", rss_mib(os.getpid()), rss_mib(child("gemma")), None)]
        ttft_ms(http, "small")
        small_pid = child("small")
        rows.append(("small loaded", rss_mib(os.getpid()), rss_mib(child("gemma")),
                     rss_mib(small_pid)))  # fmt: skip
        while pool.slot("small").state != "unloaded":
            time.sleep(0.1)
        time.sleep(1.0)
        gone = not Path(f"/proc/{small_pid}").exists()
        rows.append(("after keep_alive", rss_mib(os.getpid()), rss_mib(child("gemma")), None))
    print("| moment | server RSS MiB | gemma's engine RSS MiB | small's engine RSS MiB |")
    print("|---|---|---|---|")
    for name, server, gemma, small in rows:
        small_text = f"{small:.0f}" if small is not None else "—"
        print(f"| {name} | {server:.0f} | {gemma:.0f} | {small_text} |")
    print(f"small's engine process gone after keep_alive: {gone}")


def swaps(rounds: int) -> None:
    if rounds <= 0:
        return
    cold, warm, swapped = [], [], []
    for _ in range(rounds):
        with serving(config(max_loaded_models=1), thread=True) as served:
            http = served.thread.http
            cold.append(ttft_ms(http, "small"))  # gemma evicted: cold and a swap at once
            warm.append(ttft_ms(http, "small"))
            swapped.append(ttft_ms(http, "gemma"))  # small evicted, gemma loaded again
    print(f"| TTFT ms (median of {rounds}) | cold (first request, evicts the other) | warm "
          "| swapped back |")  # fmt: skip
    print("|---|---|---|---|")
    print(f"| small / gemma | {statistics.median(cold):.0f} | {statistics.median(warm):.0f} | "
          f"{statistics.median(swapped):.0f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    memory()
    swaps(args.rounds)


if __name__ == "__main__":
    main()
