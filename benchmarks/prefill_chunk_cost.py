"""What does a prompt chunk of k tokens add to a step of three decoding streams, at a given depth?

One step of three decoding streams (at depth 300) plus a chunk of k prompt tokens at depth 200,
800 and 1,500 into a paste, on the bench's bare llama_batch (`localserve.bench.engine.BareBatch`,
median of five), for models.toml's default model (run from the repository root), with
flash attention as configured or as given:

    .venv/bin/python benchmarks/prefill_chunk_cost.py [flash_attn: auto|on|off]

Prints a line per depth: the three decodes alone, then the step in ms for each k (32 ... 256).

A one-off probe whose decision is made (issue 14): a batch of 64 rows or more costs ~30 ms more
than one of 63 (CPU flash attention changes path there), so the step-cost model prices a token
by batch size, learned online (docs/benchmarks.md, "Performance, round two (issue 14)", "What
changed" and "The probes"). Kept because the cliff belongs to the llama.cpp build and the
machine: rerun it after upgrading llama.cpp or on new hardware to see where the step jumps.
"""

import statistics
import sys
import time

import llama_cpp
import msgspec

from localserve.bench.engine import BareBatch
from localserve.bench.scenario import pages
from localserve.config import load_config
from localserve.runners.models import open_runner

config = load_config("models.toml")
if len(sys.argv) > 1:
    model = config.models[config.default]
    config.models[config.default] = msgspec.structs.replace(model, flash_attn=sys.argv[1])
runner = open_runner(config, None)
text = runner.tokenize(" ".join(pages()))
STREAMS = (1, 2, 3)


def step_ms(bare: BareBatch, k: int, depth: int, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        runner.free_seq(0)
        for lo in range(0, depth, 512):  # the paste so far
            n = min(512, depth - lo)
            bare.decode([(0, text[lo + i], lo + i) for i in range(n)], logits_last=True)
        entries = [(s, text[300], 300) for s in STREAMS]
        entries += [(0, text[depth + i], depth + i) for i in range(k)]
        n = len(entries)
        seq_ids, tokens, positions = zip(*entries, strict=True)
        bare.token[:n], bare.pos[:n] = tokens, positions
        bare.logits[:n] = 0
        bare.logits[: len(STREAMS)] = 1
        bare.logits[n - 1] = 1
        for i, sid in enumerate(seq_ids):
            if bare.seq_ids[i] != sid:
                bare.batch.seq_id[i][0] = bare.seq_ids[i] = sid
        bare.batch.n_tokens = n
        start = time.perf_counter()
        assert llama_cpp.llama_decode(bare.ctx, bare.batch) == 0
        times.append(time.perf_counter() - start)
        for s in STREAMS:
            llama_cpp.llama_memory_seq_rm(runner.mem, s, 300, -1)
    return statistics.median(times) * 1e3


with BareBatch(runner) as bare:
    for s in STREAMS:  # three streams at depth 300
        for lo in range(0, 300, 100):
            bare.decode([(s, text[lo + i], lo + i) for i in range(100)], logits_last=True)
    for depth in (200, 800, 1500):
        row = [f"depth {depth}: 3 decodes alone {step_ms(bare, 0, depth):.1f} ms"]
        row += [f"+{k}: {step_ms(bare, k, depth):.0f}" for k in (32, 54, 56, 58, 60, 61, 62, 64,
                                                                 66, 96, 128, 256)]
        print("; ".join(row), flush=True)
runner.close()
