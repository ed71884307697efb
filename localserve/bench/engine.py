"""Engine benchmark: decode throughput through the engine against a bare llama_decode loop.

Both run on the same model and the same llama.cpp context, alternately, in one process:
- bare: N sequences, one llama_batch of N tokens per step, argmax over each row's logits —
  the least Python a decode loop can have (the ceiling);
- engine: the same N greedy requests through `Engine.step()` (scheduler, batch filling,
  sampling, detokenising, metrics, events).
Figures: aggregate decode tokens/s at each concurrency, the engine's share of the bare loop,
the engine's time outside llama_decode per step (broken down), and prefill tokens/s.
Run with `localserve bench-engine` (see docs/benchmarks.md).

Tested in tests/e2e/test_engine_benchmark.py.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time

import llama_cpp
import msgspec
import numpy as np

from localserve.config import Config
from localserve.engine.engine import Engine
from localserve.engine.sampling_params import SamplingParams
from localserve.runners.models import open_runner

PROMPT = "Tell me a long story about a lighthouse keeper and the sea. "
REPEATS = 6


class BareBatch:
    """A llama_batch of its own on the runner's context: the bare loop shares no runner state.

    Tokens, positions and logit flags are written through numpy views, as the runner does.
    """

    def __init__(self, runner) -> None:
        self.ctx, n = runner.ctx, runner.info.n_batch
        self.batch = b = llama_cpp.llama_batch_init(n, 0, 1)
        self.token = np.ctypeslib.as_array(b.token, shape=(n,))
        self.pos = np.ctypeslib.as_array(b.pos, shape=(n,))
        self.logits = np.ctypeslib.as_array(b.logits, shape=(n,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(n,))[:] = 1
        self.seq_ids = [-1] * n  # what each row's seq_id holds, to write only changes

    def decode(self, entries: list[tuple[int, int, int]], logits_last: bool) -> None:
        """entries: (seq id, token, position); every token wants logits unless logits_last."""
        k = len(entries)
        seq_ids, tokens, positions = zip(*entries, strict=True)
        self.token[:k], self.pos[:k] = tokens, positions
        self.logits[:k] = 0 if logits_last else 1
        self.logits[k - 1] = 1
        for i, seq_id in enumerate(seq_ids):
            if self.seq_ids[i] != seq_id:
                self.batch.seq_id[i][0] = self.seq_ids[i] = seq_id
        self.batch.n_tokens = k
        rc = llama_cpp.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def __enter__(self) -> BareBatch:
        return self

    def __exit__(self, *exc) -> None:
        llama_cpp.llama_batch_free(self.batch)


def bare_decode(runner, n: int, steps: int) -> float:
    """Decode tokens/s of a minimal loop: prefill n short prompts, then `steps` batched decodes."""
    prompt = runner.tokenize(PROMPT)
    tokens = [prompt[-1]] * n
    n_vocab = runner.info.n_vocab
    with BareBatch(runner) as bare:
        for s in range(n):  # prefill each sequence's prompt (not timed)
            bare.decode([(s, t, p) for p, t in enumerate(prompt)], logits_last=True)
        pos = len(prompt)
        start = time.perf_counter()
        for _ in range(steps):
            bare.decode([(s, tokens[s], pos) for s in range(n)], logits_last=False)
            for s in range(n):
                logits = llama_cpp.llama_get_logits_ith(runner.ctx, s)
                tokens[s] = int(np.ctypeslib.as_array(logits, shape=(n_vocab,)).argmax())
            pos += 1
        elapsed = time.perf_counter() - start
    for s in range(n):
        runner.free_seq(s)
    return n * steps / elapsed


GREEDY = SamplingParams(temperature=0, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1, ignore_eos=True)
PHASES = ("schedule", "fill", "decode", "sample", "postprocess", "emit")


def engine_decode(runner, config, n: int, steps: int, params=GREEDY) -> dict[str, float]:
    """Decode tokens/s through the engine, timing only steps where all n sequences decode.

    The breakdown comes from the engine's and the runner's public timings of each step.
    """
    engine = Engine(runner, _no_reuse(config), clock=time.perf_counter)
    prompt = runner.tokenize(PROMPT)
    params = msgspec.structs.replace(params, max_tokens=steps + 2)
    for i in range(n):
        engine.add_request(f"r{i}", prompt, params, user=f"u{i}")
    while len(engine.scheduler.running) < n or any(
        s.is_prefilling or s.num_computed == 0 for s in engine.scheduler.running
    ):
        engine.step()
    spent = dict.fromkeys(PHASES, 0.0)
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
        for timings in (engine.timings, runner.timings):
            for phase, seconds in timings._asdict().items():
                key = phase.removesuffix("_s")
                if key in spent:
                    spent[key] += seconds
    elapsed = time.perf_counter() - start
    while engine.scheduler.has_work:
        engine.step()
    return {
        "tokens_per_s": n * steps / elapsed,
        "step_ms": elapsed / steps * 1e3,
        "engine_share": (elapsed - spent["decode"]) / elapsed,
        **{f"{k}_ms": v / steps * 1e3 for k, v in spent.items() if k != "decode"},
    }


def prefill_rates(runner, config, n_tokens: int = 2048) -> dict[str, float]:
    """Prompt tokens/s for one long prompt: through the engine and as bare n_batch chunks."""
    words = (PROMPT * 200).split()
    prompt = runner.tokenize(" ".join(words))[:n_tokens]
    n_batch = runner.info.n_batch
    with BareBatch(runner) as bare:
        start = time.perf_counter()
        for lo in range(0, len(prompt), n_batch):
            chunk = prompt[lo : lo + n_batch]
            bare.decode([(0, t, lo + i) for i, t in enumerate(chunk)], logits_last=True)
        bare_rate = len(prompt) / (time.perf_counter() - start)
    runner.free_seq(0)
    engine = Engine(runner, _no_reuse(config))
    engine.add_request("p", prompt, SamplingParams(temperature=0, max_tokens=1))
    start = time.perf_counter()
    engine.step()  # takes the request in
    while engine.scheduler.has_work:
        engine.step()
    return {
        "bare_tokens_per_s": bare_rate,
        "engine_tokens_per_s": len(prompt) / (time.perf_counter() - start),
    }


def run_benchmark(
    config: Config,
    model: str | None,
    concurrency: list[int],
    steps: int,
    out: str | None,
    prefill_tokens: int = 2048,
) -> int:
    runner = open_runner(config, model)
    max_num_seqs = runner.info.max_num_seqs or runner.info.n_seq_max
    if max(concurrency) > max_num_seqs:
        raise ValueError(f"concurrency {max(concurrency)} exceeds max_num_seqs {max_num_seqs}")
    try:
        bare_decode(runner, 1, 8)  # warm-up
        rows = []
        for n in concurrency:
            bare, eng = [], []
            for i in range(REPEATS):  # back-to-back pairs, alternating who goes first
                if i % 2:
                    eng.append(engine_decode(runner, config, n, steps))
                bare.append(bare_decode(runner, n, steps))
                if not i % 2:
                    eng.append(engine_decode(runner, config, n, steps))
            best = max(eng, key=lambda r: r["tokens_per_s"])
            row = {
                "concurrency": n,
                "bare_tokens_per_s": statistics.median(bare),
                "engine": {k: statistics.median(r[k] for r in eng) for k in best},
            }
            # pairs ran back to back: the median of their ratios cancels most machine drift
            ratios = [e["tokens_per_s"] / b for e, b in zip(eng, bare, strict=True)]
            row["ratio"] = statistics.median(ratios)
            rows.append(row)
            print(_row_text(row), flush=True)
        n = max(concurrency)
        sampled = engine_decode(runner, config, n, steps, SAMPLED)
        print(
            f"{n:>3} seqs sampled (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05): "
            f"{sampled['tokens_per_s']:.1f} tok/s, step {sampled['step_ms']:.1f} ms, "
            f"outside llama_decode {sampled['engine_share']:.1%}"
        )
        prefill = prefill_rates(runner, config, prefill_tokens)
        print(
            f"prefill: bare {prefill['bare_tokens_per_s']:.0f} tokens/s, "
            f"engine {prefill['engine_tokens_per_s']:.0f} tokens/s"
        )
        result = {
            "machine": _machine(runner),
            "steps": steps,
            "repeats": REPEATS,
            "decode": rows,
            "sampled": sampled,
            "prefill": prefill,
        }
        if out:
            with open(out, "w") as f:
                json.dump(result, f, indent=2)
        return 0
    finally:
        runner.close()


def _no_reuse(config):
    """The scheduler config without prefix caching: every round prefills the same prompt."""
    return msgspec.structs.replace(config.scheduler, prefix_caching=False)


def _row_text(row: dict) -> str:
    e = row["engine"]
    return (
        f"{row['concurrency']:>3} seqs: bare {row['bare_tokens_per_s']:7.1f} tok/s, "
        f"engine {e['tokens_per_s']:7.1f} tok/s ({row['ratio']:.1%}); step {e['step_ms']:.1f} ms, "
        f"outside llama_decode {e['engine_share']:.1%} (schedule {e['schedule_ms']:.2f}, "
        f"fill {e['fill_ms']:.2f}, sample {e['sample_ms']:.2f}, "
        f"postprocess {e['postprocess_ms']:.2f}, emit {e['emit_ms']:.2f} ms)"
    )


def _machine(runner) -> dict:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    where = runner.where() if hasattr(runner, "where") else ""
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "runner": msgspec.to_builtins(runner.info),
        "where": where,
    }
