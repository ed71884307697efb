"""The real model's runner for engine tests, and running requests on it step by step
(tests/e2e/test_llama_runner.py, tests/e2e/test_speculative_decoding.py)."""

from __future__ import annotations

from localserve.config import ModelConfig, SchedulerConfig
from localserve.engine.engine import Engine
from localserve.engine.events import Token
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
