"""What do cells kept for other sequences cost a live one, at the speculation benchmark's context
(65,536 cells)? The runner opens the models.toml default model as the server would (unified
cells, swa_full, its flash attention setting), with that context; then a 2,000-token prefill
and a decode step's median (of 30) in a fresh sequence: on an empty cache, beside FILL (default
20,000) cells of another sequence, and after those are removed. llama.cpp attends over every
cell up to the highest in use and masks the others' (issue 52: why `[scheduler]
shed_saved_prefixes` sheds what the host tier holds; at 8,192 cells, issue 6's
prefix_cache_window_cost.py). Filling takes ~40 s on 2 cores.

    .venv/bin/python benchmarks/kept_cells_cost.py [FILL]

Figures: docs/benchmarks.md, "Speculation: long drafts, ..." (issue 52), "Kept cells".
"""

import sys
import time

import llama_cpp
import msgspec

from localserve.config import load_config
from localserve.runners.models import open_runner

FILL = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
config = load_config()
model = config.models[config.default]
config.models[config.default] = msgspec.structs.replace(model, n_ctx=65536)
runner = open_runner(config, config.default)
CHUNK = runner.n_batch
b = llama_cpp.llama_batch_init(CHUNK, 0, 1)


def dec(s, st, k):
    for j in range(k):
        b.token[j] = 100 + (j * 7919 + st) % 20000
        b.pos[j] = st + j
        b.n_seq_id[j] = 1
        b.seq_id[j][0] = s
        b.logits[j] = 1 if j == k - 1 else 0
    b.n_tokens = k
    t = time.perf_counter()
    assert llama_cpp.llama_decode(runner.ctx, b) == 0
    return time.perf_counter() - t


def prefill(s, n):
    t = 0.0
    for st in range(0, n, CHUNK):
        t += dec(s, st, min(CHUNK, n - st))
    return t


def trial(s, label):
    pf = prefill(s, 2000)
    d = sorted(dec(s, 2000 + i, 1) for i in range(30))[15]
    print(f"{label}: prefill 2000 {pf:.2f} s, decode step median {d * 1000:.1f} ms", flush=True)
    runner.free_seq(s)


trial(0, "empty cache")
t = prefill(1, FILL)
print(f"filled seq 1 with {FILL} in {t:.1f} s", flush=True)
trial(2, f"beside {FILL} retained cells")
runner.free_seq(1)
trial(3, "after removing them")
llama_cpp.llama_batch_free(b)
runner.close()
