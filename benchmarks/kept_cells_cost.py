"""What do cells kept for other sequences cost a live one, at the speculation benchmark's context
(65,536 cells, unified, swa_full, flash attention auto: the runner's settings)? A 2,000-token
prefill and a decode step's median (of 30) in a fresh sequence: on an empty cache, beside FILL
(default 20,000) cells of another sequence, and after those are removed. llama.cpp attends over
every cell up to the highest in use and masks the others' (issue 52: why `[scheduler]
shed_saved_prefixes` sheds what the host tier holds; at 8,192 cells, issue 6's
prefix_cache_window_cost.py). Filling takes ~40 s on 2 cores.

    .venv/bin/python benchmarks/kept_cells_cost.py [FILL]

Figures: docs/benchmarks.md, "Speculation: long drafts, ..." (issue 52), "Kept cells".
"""

import sys
import time

import llama_cpp

from localserve.runners.models import ensure_embedded

FILL = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
path = str(ensure_embedded())
llama_cpp.llama_backend_init()
mp = llama_cpp.llama_model_default_params()
mp.use_extra_bufts = False
model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
p = llama_cpp.llama_context_default_params()
p.n_ctx = 65536
p.n_batch = p.n_ubatch = 512
p.n_seq_max = 32
p.n_outputs_max = 64
p.kv_unified = True
p.swa_full = True
p.flash_attn_type = -1
p.n_threads = p.n_threads_batch = 2
p.no_perf = True
ctx = llama_cpp.llama_init_from_model(model, p)
mem = llama_cpp.llama_get_memory(ctx)
b = llama_cpp.llama_batch_init(512, 0, 1)


def dec(s, st, k):
    for j in range(k):
        b.token[j] = 100 + (j * 7919 + st) % 20000
        b.pos[j] = st + j
        b.n_seq_id[j] = 1
        b.seq_id[j][0] = s
        b.logits[j] = 1 if j == k - 1 else 0
    b.n_tokens = k
    t = time.perf_counter()
    assert llama_cpp.llama_decode(ctx, b) == 0
    return time.perf_counter() - t


def prefill(s, n):
    t = 0.0
    for st in range(0, n, 512):
        t += dec(s, st, min(512, n - st))
    return t


def trial(s, label):
    pf = prefill(s, 2000)
    d = sorted(dec(s, 2000 + i, 1) for i in range(30))[15]
    print(f"{label}: prefill 2000 {pf:.2f} s, decode step median {d * 1000:.1f} ms", flush=True)
    llama_cpp.llama_memory_seq_rm(mem, s, -1, -1)


trial(0, "empty cache")
t = prefill(1, FILL)
print(f"filled seq 1 with {FILL} in {t:.1f} s", flush=True)
trial(2, f"beside {FILL} retained cells")
llama_cpp.llama_memory_seq_rm(mem, 1, -1, -1)
trial(3, "after removing them")
