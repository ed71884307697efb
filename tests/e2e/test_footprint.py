"""The memory estimate from the GGUF header (runners/footprint.py) against what llama.cpp itself
says it allocated when the real embedded model loads (its log: model, KV, compute and output
buffers, read by runners/placement.py). Figures for more settings: docs/benchmarks.md."""

from __future__ import annotations

import pytest

from localserve.config import ModelConfig
from localserve.runners.footprint import MIB, estimate, logit_rows
from localserve.runners.gguf_header import read_header
from localserve.runners.llama import LlamaRunner
from localserve.runners.models import ensure_embedded

pytestmark = pytest.mark.model


def test_the_estimate_is_within_6_percent_of_llama_cpps_buffers():
    path = ensure_embedded()
    cfg = ModelConfig(embedded=True, chat_template="gemma", n_ctx=4000, cache_type_k="q8_0")
    need = estimate(read_header(path), cfg)
    runner = LlamaRunner("gemma-3-270m", path, cfg)
    p = runner.placement
    assert need.weights_host / MIB == pytest.approx(sum(p.model_mib.values()), abs=0.01)
    assert need.kv / MIB == pytest.approx(p.kv_total_mib, abs=0.01)  # exact: 4096 cells
    compute = sum(p.compute_mib.values()) + sum(p.output_mib.values())
    assert compute * MIB <= need.compute_host  # an upper bound ...
    total = sum(p.model_mib.values()) + p.kv_total_mib + compute
    # the output buffer starts at n_seq_max rows and grows to logit_rows with the first batch of
    # drafts: the estimate counts the grown one
    rows = logit_rows(cfg) - (cfg.max_num_seqs + cfg.max_cached_prefixes)
    total += rows * runner.n_vocab * 4 / MIB
    assert need.total / MIB == pytest.approx(total, rel=0.06)  # ... a few percent of the whole
