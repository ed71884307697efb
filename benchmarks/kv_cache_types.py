"""What a quantized KV cache does on this machine: memory, decode step time, greedy agreement.

Issue 12. For each KV cell type (f16, q8_0, q4_0) the embedded model is loaded with the
server's default context (n_ctx 8192, 16 sequences, batch 512, flash attention auto). Figures:

- memory: the KV cache's size as llama.cpp allocates it (its own log line), and the process's
  RSS growth while loading that runner;
- step time: the bare llama_decode loop of `localserve bench-engine` (prefill a short prompt per
  sequence, then batched greedy decodes) at 1 and 16 sequences, rounds alternating the types;
- greedy agreement with f16: a fixed set of prompts, each decoded alone for 48 greedy tokens;
  the share of prompts whose tokens are identical, and the mean length of the common prefix.

Run (one process holds three runners of the embedded model):

    .venv/bin/python benchmarks/kv_cache_types.py [--rounds 3]

Prints one markdown table, a row per cell type (KV MiB, RSS growth, each round's step time at 1
and 16 sequences, greedy agreement with f16 and the mean common prefix), and the control line
(f16 decoded twice); JSON to bench-results/kv_cache_types.json.
Figures: docs/benchmarks.md, "Quantized KV cells: q8_0 and q4_0 against f16 (issue 12)".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from localserve.bench.engine import bare_decode  # noqa: E402
from localserve.config import ModelConfig  # noqa: E402
from localserve.runners.llama import LlamaRunner  # noqa: E402
from localserve.runners.models import ensure_embedded  # noqa: E402

TYPES = ["f16", "q8_0", "q4_0"]
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "The three primary colours are",
    "Water boils at",
    "A haiku about autumn:",
    "List of planets in the solar system: Mercury,",
    "In 1969, the first person to walk on the Moon was",
    "The recipe for bread needs flour, water,",
    "Photosynthesis is the process by which",
    "User: What is the tallest mountain?\nAssistant:",
    "The quick brown fox",
]
GREEDY_TOKENS = 48


def rss_mib() -> float:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def greedy(runner: LlamaRunner, prompt: str, n: int) -> list[int]:
    """n greedy tokens after the prompt, sequence 0 alone in the cache."""
    import llama_cpp
    import numpy as np

    from localserve.bench.engine import BareBatch

    tokens = runner.tokenize(prompt)
    out, pos = [], len(tokens)
    with BareBatch(runner) as bare:
        bare.decode([(0, t, p) for p, t in enumerate(tokens)], logits_last=True)
        for _ in range(n):
            logits = llama_cpp.llama_get_logits_ith(runner.ctx, -1)
            out.append(int(np.ctypeslib.as_array(logits, shape=(runner.info.n_vocab,)).argmax()))
            bare.decode([(0, out[-1], pos)], logits_last=True)
            pos += 1
    runner.free_seq(0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runners, result = {}, {"types": {}}
    for kind in TYPES:
        before = rss_mib()
        cfg = ModelConfig(embedded=True, n_ctx=8192, max_num_seqs=16, max_num_batched_tokens=512,
                          cache_type_k=kind, cache_type_v=kind)  # fmt: skip
        runners[kind] = LlamaRunner("gemma-3-270m", ensure_embedded(), cfg)
        p = runners[kind].placement
        result["types"][kind] = {"kv_mib": p.kv_total_mib, "rss_growth_mib": rss_mib() - before,
                                 "flash_attn": p.flash_attn, "step_ms": {1: [], 16: []}}  # fmt: skip
    for _ in range(args.rounds):
        for kind in TYPES:
            for n, steps in ((1, 64), (16, 32)):
                tok_s = bare_decode(runners[kind], n, steps)
                result["types"][kind]["step_ms"][n].append(1000 * n / tok_s)
    reference = {p: greedy(runners["f16"], p, GREEDY_TOKENS) for p in PROMPTS}
    again = sum(greedy(runners["f16"], p, GREEDY_TOKENS) == reference[p] for p in PROMPTS)
    result["f16_again_identical"] = f"{again}/{len(PROMPTS)}"  # the control: f16 twice
    for kind in TYPES[1:]:
        same, prefixes = 0, []
        for prompt in PROMPTS:
            got = greedy(runners[kind], prompt, GREEDY_TOKENS)
            ref = reference[prompt]
            common = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), len(ref))
            same += got == ref
            prefixes.append(common)
        result["types"][kind]["greedy_identical"] = f"{same}/{len(PROMPTS)}"
        result["types"][kind]["greedy_common_prefix_mean"] = statistics.mean(prefixes)
    print(f"| KV cells | KV cache (MiB) | RSS growth (MiB) | step at 1 seq (ms) | step at 16 "
          f"seqs (ms) | greedy = f16 ({GREEDY_TOKENS} tokens) | common prefix (mean tokens) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, r in result["types"].items():
        s1 = " / ".join(f"{x:.1f}" for x in r["step_ms"][1])
        s16 = " / ".join(f"{x:.1f}" for x in r["step_ms"][16])
        same = r.get("greedy_identical", "—")
        prefix = f"{r['greedy_common_prefix_mean']:.1f}" if "greedy_identical" in r else "—"
        print(f"| {kind} | {r['kv_mib']:.0f} | {r['rss_growth_mib']:.0f} | {s1} | {s16} | "
              f"{same} | {prefix} |")
    print(f"control: f16 decoded twice gives identical tokens for {result['f16_again_identical']}")
    out = ROOT / "bench-results" / "kv_cache_types.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    for runner in runners.values():
        runner.close()


if __name__ == "__main__":
    main()
