"""One person flipping models beside another person's requests, with room for one model
(issue 51, finding 2).

One server (in this process, the engines in their own) with the embedded model under two
names, "gemma" and "small" (a smaller n_ctx), `max_loaded_models = 1`: every request for the
model not loaded is a swap. bob asks "gemma" for 8-token replies one after another: his TTFT
alone first (the control), then while ann flips between "small" and "gemma" as fast as her
replies come. Prints bob's TTFT p50 / max alone and beside ann, how many swaps happened, and
what ann was told while she waited. Run on a quiet machine:

    .venv/bin/python benchmarks/swap_churn.py [--replies 12]

Figures: docs/benchmarks.md, "One person flipping models (issue 51)".
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    from localserve.bench.blocking_ws import WS
    from localserve.config import Config, ModelConfig, ServerConfig
    from localserve.runners.models import ensure_embedded
    from localserve.serve.serving import serving

    a = argparse.ArgumentParser()
    a.add_argument("--replies", type=int, default=12)
    args = a.parse_args()
    same = dict(chat_format="transcript", chat_template="gemma", n_threads=2)
    gguf = str(ensure_embedded())
    config = Config(
        default="gemma",
        models={
            "gemma": ModelConfig(embedded=True, n_ctx=2048, **same),
            "small": ModelConfig(path=gguf, n_ctx=1024, **same),
        },
        server=ServerConfig(max_loaded_models=1, state_dir=tempfile.mkdtemp(), usage=False),
    )

    def ttft(ws: WS, rid: str, model: str) -> float:
        start = time.monotonic()
        ws.chat(rid, "Hello", model=model, max_tokens=8)
        ws.until(lambda f: f["type"] in ("token", "done") and f.get("id") == rid, 300)
        took = time.monotonic() - start
        ws.until_done(rid, 300)
        return took

    with serving(config, thread=True) as served:
        bob = WS(served.thread.url)
        bob.hello("bob")
        ttft(bob, "warm", "gemma")
        alone = [ttft(bob, f"a{i}", "gemma") for i in range(args.replies)]
        stop, told, flips = threading.Event(), [], [0]

        def flip() -> None:
            ann = WS(served.thread.url)
            ann.hello("ann")
            try:
                for i in range(10_000):
                    if stop.is_set():
                        return
                    ann.chat(f"f{i}", "Hi", model=("small", "gemma")[i % 2], max_tokens=4)
                    frames = ann.until(lambda f: f["type"] == "done" or stop.is_set(), 600)
                    told.extend(f["loading"] for f in frames if f.get("loading"))
                    flips[0] += 1
            except Exception:  # the server closed under her: done
                return

        flipper = threading.Thread(target=flip, daemon=True)
        flipper.start()
        beside = [ttft(bob, f"b{i}", "gemma") for i in range(args.replies)]
        stop.set()
        swaps = getattr(served.server.pool, "swaps", None)  # None: before the swap budget
        counted = sum(len(s) for s in swaps._swaps.values()) if swaps else "-"
    p50 = statistics.median
    print(f"bob alone:      TTFT p50 {p50(alone) * 1e3:.0f} ms, max {max(alone) * 1e3:.0f} ms")
    print(f"beside ann:     TTFT p50 {p50(beside) * 1e3:.0f} ms, max {max(beside) * 1e3:.0f} ms")
    print(f"ann's replies: {flips[0]}; swaps counted against someone: {counted}")
    print(f"ann was told: {sorted(set(told))[:4]}")


if __name__ == "__main__":
    main()
