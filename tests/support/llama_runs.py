"""The real model's runner for engine tests, and running requests on it step by step
(tests/e2e/test_llama_runner.py, tests/e2e/test_speculative_decoding.py), and how far two
greedy replies may differ (at a near-tie of llama.cpp's batch-dependent arithmetic)."""

from __future__ import annotations

import numpy as np

from localserve.config import ModelConfig, SchedulerConfig
from localserve.engine.batch import Batch, BatchItem
from localserve.engine.engine import Engine
from localserve.engine.events import Token
from localserve.engine.sampling_params import SamplingParams
from localserve.engine.sequence import Sequence
from localserve.runners.models import ensure_embedded

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "The three primary colours are",
    "Water boils at",
    "A haiku about autumn:",
    "List of planets in the solar system: Mercury,",
    "In 1969, the first person to walk on the Moon was",
]


def open_runner():
    """The embedded model: 2,048 cells, eight running sequences, 256-token steps."""
    from localserve.runners.llama import LlamaRunner

    cfg = ModelConfig(
        embedded=True,
        chat_template="gemma",
        n_ctx=2048,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        n_threads=2,
    )
    return LlamaRunner("gemma-3-270m", ensure_embedded(), cfg)


def run_engine(runner, requests, config=None, max_steps=5000, on_step=None):
    """Run (id, prompt, params, user) requests to completion; return events and the engine."""
    events = []
    engine = Engine(runner, config or SchedulerConfig(), on_events=events.extend)
    for rid, prompt, params, user in requests:
        engine.add_request(rid, runner.tokenize(prompt), params, user=user)
    for _ in range(max_steps):
        engine.step()
        if on_step:
            on_step(engine)
        if not engine.scheduler.has_work:
            break
    return events, engine


def texts(events) -> dict[str, str]:
    out: dict[str, str] = {}
    for e in events:
        if isinstance(e, Token):
            out[e.request_id] = out.get(e.request_id, "") + e.text
    return out


def all_cells(runner) -> int:
    return sum(runner.seq_num_cells(i) for i in range(runner.n_seq_max))


# llama.cpp's CPU kernels sum in an order that depends on the batch (how many rows, where the
# cells sit): the same token's logits move by up to ~1 on this Q4 model between batch shapes,
# drafts or not (a neighbour in the batch does it too: test_llama_runner's reuse test)
NEAR_TIE = 2.0


def logits_after(runner, tokens: list[int]) -> np.ndarray:
    """The model's logits for the token after `tokens`, prefilled alone in a fresh sequence."""
    params = SamplingParams(temperature=0)
    seq = Sequence("probe", tokens, params)
    seq.seq_id, seq.sampler = runner.n_seq_max - 1, runner.new_sampler(params)
    runner.free_seq(seq.seq_id)
    for start in range(0, len(tokens), runner.n_batch):
        n = min(runner.n_batch, len(tokens) - start)
        last = start + n == len(tokens)
        runner.run(Batch(items=[BatchItem(seq, start, n, last)], num_prefill_tokens=n))
    logits = runner._row(n - 1).copy()  # the last row's, still in llama.cpp's buffer
    runner.free_seq(seq.seq_id)
    return logits


def count_same(runner, off: dict[str, Sequence], on: dict[str, Sequence]) -> int:
    """How many replies are the same token for token; every other one must branch at a
    near-tie (the arithmetic's noise), never where a wrongly kept draft would put it."""
    same = 0
    for rid, seq in off.items():
        a, b = seq.tokens, on[rid].tokens
        if a == b:
            same += 1
            continue
        i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        assert i is not None, (rid, "one reply is a prefix of the other")
        logits = logits_after(runner, a[:i])
        gap = abs(float(logits[a[i]] - logits[b[i]]))
        assert gap < NEAR_TIE, (rid, i - seq.num_prompt_tokens, gap)
    return same
