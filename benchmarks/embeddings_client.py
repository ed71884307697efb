"""The client side of benchmarks/embeddings.sh: embeddings through `/v1/embeddings`, and a chat
stream's inter-token latency while someone embeds a large batch (issue 41).

    embeddings_client.py throughput URL LABEL [--clients 1 8] [--inputs 16] [--requests 4]
    embeddings_client.py itl URL LABEL [--batch 256]

`throughput`: each of C concurrent clients sends `--requests` requests of `--inputs` inputs
one after another (paragraph slices of the bench pages, 30-120 words, every input different),
after one warm-up request; prints the inputs per second over all of them, per client count.

`itl`: one streamed chat (`/v1/chat/completions`, 160 tokens, ignore_eos) alone, then the same
beside one embedding request of `--batch` inputs sent 1 s into the stream, then beside a chat
whose prompt has as many tokens as that batch, up to about 6,000 (a paste: what the engine's
prefill budget is for). Prints the stream's median and 90th-percentile gap between tokens in
each case.

Each case prints one JSON line (the shell script collects them).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time

import httpx

from localserve.bench.scenario import pages_slice

TIMEOUT = httpx.Timeout(600.0)
PASTE_WORDS = 4500  # about 6,000 tokens: a paste that fits the default 8,192-token context


def inputs(n: int, seed: int) -> list[str]:
    """n different paragraph-sized texts from the bench pages."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        words = rng.randint(30, 120)
        texts.append(" ".join(pages_slice(rng, words).split()[:words]))
    return texts


def embed(client: httpx.Client, url: str, texts: list[str]) -> int:
    r = client.post(f"{url}/v1/embeddings", json={"model": "gemma-3-270m", "input": texts})
    r.raise_for_status()
    body = r.json()
    assert len(body["data"]) == len(texts), body
    return len(texts)


def throughput(url: str, label: str, clients: list[int], n_inputs: int, n_requests: int) -> None:
    with httpx.Client(timeout=TIMEOUT) as warm:
        embed(warm, url, inputs(n_inputs, 0))
    for c in clients:
        done = [0] * c
        errors: list[BaseException] = []

        def client(i: int, done: list[int] = done, errors: list = errors) -> None:
            try:
                with httpx.Client(timeout=TIMEOUT) as http:
                    for r in range(n_requests):
                        done[i] += embed(http, url, inputs(n_inputs, 1000 * (i + 1) + r))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(c)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        if errors:
            raise errors[0]
        print(
            json.dumps(
                {
                    "case": "throughput",
                    "server": label,
                    "clients": c,
                    "inputs_per_request": n_inputs,
                    "inputs": sum(done),
                    "seconds": round(elapsed, 2),
                    "inputs_per_s": round(sum(done) / elapsed, 2),
                }
            ),
            flush=True,
        )


def stream_gaps(url: str, result: dict, started: threading.Event) -> None:
    """One streamed chat; the gaps between its content chunks, in ms, into result['gaps']."""
    body = {
        "model": "gemma-3-270m",
        "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}],
        "max_tokens": 160,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    times: list[float] = []
    with (
        httpx.Client(timeout=TIMEOUT) as http,
        http.stream("POST", f"{url}/v1/chat/completions", json=body) as r,
    ):
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                times.append(time.perf_counter())
                if len(times) == 2:
                    started.set()
    started.set()
    result["gaps"] = [1000 * (b - a) for a, b in zip(times, times[1:], strict=False)]


def itl(url: str, label: str, batch: int) -> None:
    texts = inputs(batch, 7)
    # as many tokens as the batch, up to what one chat fits (n_ctx 8192: 256 inputs are ~19k)
    paste = " ".join(" ".join(texts).split()[:PASTE_WORDS])

    def embed_batch() -> None:
        with httpx.Client(timeout=TIMEOUT) as http:
            embed(http, url, texts)

    def paste_chat() -> None:
        with httpx.Client(timeout=TIMEOUT) as http:
            msg = [{"role": "user", "content": "Summarise this:\n" + paste}]
            r = http.post(
                f"{url}/v1/chat/completions",
                json={"model": "gemma-3-270m", "messages": msg, "max_tokens": 1},
            )
            r.raise_for_status()

    cases = (("alone", None), ("beside_embedding", embed_batch), ("beside_paste", paste_chat))
    for case, other in cases:
        result: dict = {}
        started = threading.Event()
        stream = threading.Thread(target=stream_gaps, args=(url, result, started))
        stream.start()
        started.wait(60)
        t_other = None
        if other is not None:
            time.sleep(1.0)
            t0 = time.perf_counter()
            other()
            t_other = time.perf_counter() - t0
        stream.join()
        gaps = sorted(result["gaps"])
        print(
            json.dumps(
                {
                    "case": "itl",
                    "server": label,
                    "beside": case,
                    "batch_inputs": batch,
                    "other_s": None if t_other is None else round(t_other, 2),
                    "itl_p50_ms": round(statistics.median(gaps), 1),
                    "itl_p90_ms": round(gaps[int(0.9 * (len(gaps) - 1))], 1),
                    "itl_max_ms": round(gaps[-1], 1),
                }
            ),
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("case", choices=["throughput", "itl"])
    p.add_argument("url")
    p.add_argument("label")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    p.add_argument("--inputs", type=int, default=16)
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--batch", type=int, default=256)
    a = p.parse_args()
    if a.case == "throughput":
        throughput(a.url.rstrip("/"), a.label, a.clients, a.inputs, a.requests)
    else:
        itl(a.url.rstrip("/"), a.label, a.batch)


if __name__ == "__main__":
    main()
