"""What does a draft row cost? (issues 37, 52) One llama_decode of N sequences at position 300,
each carrying its last token and k draft tokens (up to 48), every row with logits, against the
same batch without drafts (k = 0): the embedded model, 2 threads, median of 8 per point, in ms.
The speculative planner prices draft rows apart (engine/budget.py, `DraftRowCost`: a fixed part
where the step has one logit row, then per row); this is the check.

    .venv/bin/python benchmarks/draft_row_cost.py

MODEL (a GGUF path; default the embedded model) and NGL (layers on the GPU; default 0) are for
benchmarks/gpu.sh, which runs it on llama.cpp's CUDA backend: what a draft row costs there
decides how far speculation can go (docs/benchmarks.md, "What drafts could reach on this CPU").
Figures: docs/benchmarks.md, "Speculative decoding".
"""

import os
import time

import llama_cpp
import numpy as np

from localserve.runners.models import ensure_embedded

path = os.environ.get("MODEL") or str(ensure_embedded())
llama_cpp.llama_backend_init()
mp = llama_cpp.llama_model_default_params()
mp.use_extra_bufts = False
mp.n_gpu_layers = int(os.environ.get("NGL", "0"))
model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
p = llama_cpp.llama_context_default_params()
p.n_ctx = 8192
p.n_batch = p.n_ubatch = 512
p.n_seq_max = 16
p.n_outputs_max = 160
p.kv_unified = True
p.n_threads = p.n_threads_batch = 2
p.no_perf = True
ctx = llama_cpp.llama_init_from_model(model, p)
mem = llama_cpp.llama_get_memory(ctx)
b = llama_cpp.llama_batch_init(512, 0, 1)


def dec(items):  # list of (seq, start, n, logits_all)
    n = 0
    for s, st, k, la in items:
        for j in range(k):
            b.token[n] = 100 + j
            b.pos[n] = st + j
            b.n_seq_id[n] = 1
            b.seq_id[n][0] = s
            b.logits[n] = 1 if (la or j == k - 1) else 0
            n += 1
    b.n_tokens = n
    t = time.perf_counter()
    rc = llama_cpp.llama_decode(ctx, b)
    assert rc == 0
    return time.perf_counter() - t


for s in range(16):
    dec([(s, 0, 300, False)])
for nseq in (1, 2, 3, 4, 8, 16):
    for k in (k for k in (0, 1, 2, 4, 8, 16, 32, 48) if nseq * (1 + k) <= p.n_outputs_max):
        ts = []
        for _ in range(8):
            ts.append(dec([(s, 300, 1 + k, True) for s in range(nseq)]))
            for s in range(nseq):
                llama_cpp.llama_memory_seq_rm(mem, s, 300, -1)
        print(nseq, k, "%.1f ms" % (1e3 * np.median(ts)), flush=True)
