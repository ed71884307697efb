"""How fast does the engine embed? (issue 41) The engine alone (no server) on the embedded model,
2 threads, mean pooled: inputs per second for requests of 16 inputs from 1 client (requests one
after another) and from 8 clients at once, how long one 64-input request takes alone, and the
same 64 inputs beside a chat that streams (its inter-token gaps while they embed).

    .venv/bin/python benchmarks/embedding_throughput.py

Figures: docs/benchmarks.md, "Embeddings".
"""

import statistics
import threading
import time

from localserve.config import ModelConfig, SchedulerConfig
from localserve.engine.engine import Engine
from localserve.engine.events import Done, Embedded, EventRouter, Token
from localserve.engine.sampling_params import SamplingParams
from localserve.runners.llama import LlamaRunner
from localserve.runners.models import ensure_embedded

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "near",
    "river",
    "bank",
    "at",
    "dawn",
]


def texts(n: int, salt: int) -> list[str]:
    return [" ".join(WORDS[(i + salt + j) % len(WORDS)] for j in range(12)) for i in range(n)]


def embed(engine, router, rid, inputs, user):
    q = router.open(rid)
    engine.add_embedding(rid, inputs, user=user)
    while not isinstance(e := q.get(timeout=600), Done):
        assert isinstance(e, Embedded)
    assert e.finish_reason == "stop", e


def clients(engine, router, runner, n_clients, n_requests, n_inputs=16):
    """n_clients threads, each sending n_requests requests of n_inputs inputs in turn."""

    def client(c):
        for r in range(n_requests):
            inputs = [runner.tokenize(t) for t in texts(n_inputs, 31 * c + r)]
            embed(engine, router, f"c{c}-r{r}-{time.monotonic()}", inputs, f"user{c}")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(n_clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return n_clients * n_requests * n_inputs / elapsed, elapsed


def main():
    cfg = ModelConfig(
        embedded=True,
        chat_template="gemma",
        n_ctx=4096,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        n_threads=2,
    )
    runner = LlamaRunner("gemma-3-270m", ensure_embedded(), cfg)
    router = EventRouter()
    engine = Engine(runner, SchedulerConfig(), on_events=router).start()
    tokens = len(runner.tokenize(texts(1, 0)[0]))
    print(f"inputs of {tokens} tokens (with BOS); max_embed_tokens {runner.info.max_embed_tokens}")
    embed(engine, router, "warm", [runner.tokenize(t) for t in texts(16, 99)], "warm")
    rate1, t1 = clients(engine, router, runner, 1, 2)
    print(f"1 client, 2 x 16 inputs: {rate1:.1f} inputs/s ({t1:.1f} s)")
    rate8, t8 = clients(engine, router, runner, 8, 1)
    print(f"8 clients, 1 x 16 inputs each: {rate8:.1f} inputs/s ({t8:.1f} s)")
    start = time.perf_counter()
    embed(engine, router, "b64", [runner.tokenize(t) for t in texts(64, 7)], "solo")
    alone = time.perf_counter() - start
    print(f"one 64-input request alone: {alone:.1f} s ({64 * tokens / alone:.0f} tokens/s)")
    # beside a stream
    chat = router.open("chat")
    params = SamplingParams(temperature=0, max_tokens=4000, ignore_eos=True)
    engine.add_request("chat", runner.tokenize("Once upon a time"), params, user="chat")
    gaps, last = [], None
    for _ in range(30):  # its ITL alone
        chat.get(timeout=60)
        now = time.perf_counter()
        if last is not None:
            gaps.append(now - last)
        last = now
    alone_itl = statistics.median(gaps)
    done = threading.Event()
    start = time.perf_counter()
    worker = threading.Thread(
        target=lambda: (
            embed(engine, router, "b64s", [runner.tokenize(t) for t in texts(64, 8)], "emb"),
            done.set(),
        )
    )
    worker.start()
    gaps, last = [], time.perf_counter()
    while not done.is_set():
        e = chat.get(timeout=60)
        if isinstance(e, Token):
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
    beside = time.perf_counter() - start
    engine.cancel("chat")
    gaps.sort()
    print(
        f"the same beside a stream: {beside:.1f} s; the stream's ITL median "
        f"{alone_itl * 1e3:.0f} ms alone, {statistics.median(gaps) * 1e3:.0f} ms "
        f"(p90 {gaps[int(0.9 * len(gaps))] * 1e3:.0f} ms, max {gaps[-1] * 1e3:.0f} ms) "
        f"beside, {len(gaps)} tokens"
    )
    engine.stop()
    runner.close()


if __name__ == "__main__":
    main()
