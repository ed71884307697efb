"""Does a schema as the server means it (closed objects, bounded numbers) slow anyone (issue 35)?

Five runs on one in-process engine with the real model (greedy, 64 tokens each), alternated
`--rounds` times so that every round holds all five within a minute or two:

- `free alone`: one unconstrained reply;
- `meant alone`: one reply constrained by a pydantic schema as the server compiles it
  (chat/constraints.py's `meant_schema`: closed objects, integers of at most 16 digits, numbers
  of 16 integral and 10 fractional digits);
- `as written alone`: the same schema compiled as plain JSON Schema (open objects, unbounded
  numbers: what the server did before), for the mask's cost side by side;
- `4 free`: four unconstrained streams;
- `3 free + 1 meant`: three unconstrained streams beside one constrained one.

Reports each run's tokens/s (completion tokens over the time from the first token to the
last), ITL, the constrained rows' mask time per token (computed on the mask thread during the
decode) and the engine thread's wait for it, and, per round, the ratios the issue asks for: a
constrained reply's tokens/s against a free one's, and the free neighbours' ITL beside a
constrained stream against four free ones.

Run: .venv/bin/python benchmarks/constrained_reply_speed.py [--rounds 5] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llguidance  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

from localserve.chat.constraints import COMPACT_JSON, ConstraintCompiler  # noqa: E402
from localserve.config import ModelConfig, SchedulerConfig  # noqa: E402
from localserve.engine.engine import Engine  # noqa: E402
from localserve.engine.events import Done  # noqa: E402
from localserve.engine.sampling_params import Constraint, SamplingParams  # noqa: E402
from localserve.runners.grammar import Constrained  # noqa: E402
from localserve.runners.llama import LlamaRunner  # noqa: E402
from localserve.runners.models import ensure_embedded  # noqa: E402


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    population: int
    area_km2: float
    capital: bool


class Cities(BaseModel):
    cities: list[City]


PROMPT = "Some large cities of the world, as JSON:"


def one_run(runner, constraint: Constraint | None, n_free: int, n_shaped: int, tokens: int):
    events: list = []
    engine = Engine(runner, SchedulerConfig(), on_events=events.extend)
    prompt = runner.tokenize(PROMPT)
    shaped = {f"c{i}" for i in range(n_shaped)}
    for rid in [*sorted(shaped), *(f"f{i}" for i in range(n_free))]:
        c = constraint if rid in shaped else None
        params = SamplingParams(max_tokens=tokens, temperature=0, constraint=c)
        engine.add_request(rid, prompt, params, user=rid)
    masks: dict[str, tuple[float, float, int]] = {}
    engine.step()  # the requests are commands until a step drains them
    while engine.scheduler.has_work:
        engine.step()
        for seq in engine._seqs.values():
            if isinstance(seq.sampler, Constrained) and seq.sampler.num_masks:
                s = seq.sampler
                masks[seq.request_id] = (s.compute_s, s.wait_s, s.num_masks)
    dones = {e.request_id: e for e in events if isinstance(e, Done)}

    def rate(rids) -> float:
        """Tokens/s after the first token: (n - 1) gaps over their total time."""
        values = []
        for rid in rids:
            d = dones[rid]
            values.append(1e3 / d.timings["itl_ms"] if d.timings["itl_ms"] else 0.0)
        return statistics.mean(values)

    free = [r for r in dones if r.startswith("f")]
    out = {
        "free_tokens_per_s": rate(free) if free else None,
        "free_itl_ms": statistics.mean(dones[r].timings["itl_ms"] for r in free) if free else None,
        "shaped_tokens_per_s": rate(shaped) if shaped else None,
        "shaped_tokens": [dones[r].completion_tokens for r in sorted(shaped)],
        "shaped_finish": [dones[r].finish_reason for r in sorted(shaped)],
    }
    if masks:
        compute, wait, n = (sum(x) for x in zip(*masks.values(), strict=True))
        out["mask_ms_per_token"] = compute / n * 1e3
        out["wait_ms_per_token"] = wait / n * 1e3
    return out


def as_written(schema: dict) -> Constraint:
    """The schema compiled as plain JSON Schema, as the server did before issue 35."""
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), COMPACT_JSON)
    return Constraint(kind="json_schema", grammar=grammar)


RUNS = (  # label, which constraint, free streams, constrained streams
    ("free alone", None, 1, 0),
    ("meant alone", "meant", 0, 1),
    ("as written alone", "written", 0, 1),
    ("4 free", None, 4, 0),
    ("3 free + 1 meant", "meant", 3, 1),
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default="bench-results/constrained_reply_speed.json")
    args = ap.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, ", end="")
    print(f"load average {os.getloadavg()[0]:.1f}")
    cfg = ModelConfig(embedded=True, n_ctx=4096, max_num_seqs=8, max_num_batched_tokens=512)
    runner = LlamaRunner("gemma-3-270m", ensure_embedded(), cfg)
    schema = Cities.model_json_schema()
    constraints = {
        "meant": ConstraintCompiler().compile_sync("json_schema", schema),
        "written": as_written(schema),
    }
    for c in constraints.values():  # the tokenizer (once) and each matcher, before timing
        runner._grammar.new_sampler(None, c)._ready()
    results: dict[str, list[dict]] = {label: [] for label, *_ in RUNS}
    for r in range(args.rounds):
        for label, which, n_free, n_shaped in RUNS:
            out = one_run(runner, constraints.get(which), n_free, n_shaped, args.tokens)
            results[label].append(out)
            print(f"round {r} {label}: {out}", flush=True)
        print(f"  load average {os.getloadavg()[0]:.1f}", flush=True)
    runner.close()
    report(results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))


def _median(runs: list[dict], key: str) -> float | None:
    values = [x[key] for x in runs if x.get(key) is not None]
    return statistics.median(values) if values else None


def report(results: dict[str, list[dict]]) -> None:
    print("\n| run | tokens/s, median | ITL ms, median | mask ms/token | engine wait ms/token |")
    print("|---|---:|---:|---:|---:|")
    for label, runs in results.items():
        key = "free" if label in ("free alone", "4 free") else "shaped"
        cells = [_median(runs, f"{key}_tokens_per_s"), _median(runs, "free_itl_ms")]
        cells += [_median(runs, "mask_ms_per_token"), _median(runs, "wait_ms_per_token")]
        shown = ["-" if c is None else f"{c:.2f}" for c in cells]
        if key == "shaped":
            shown[1] = "-" if label.endswith("alone") else shown[1]
        print(f"| {label} | " + " | ".join(shown) + " |")
    alone = [
        s["shaped_tokens_per_s"] / f["free_tokens_per_s"]
        for s, f in zip(results["meant alone"], results["free alone"], strict=True)
    ]
    written = [
        s["shaped_tokens_per_s"] / f["free_tokens_per_s"]
        for s, f in zip(results["as written alone"], results["free alone"], strict=True)
    ]
    beside = [
        b["free_itl_ms"] / f["free_itl_ms"]
        for b, f in zip(results["3 free + 1 meant"], results["4 free"], strict=True)
    ]
    print(f"\nmeant alone / free alone, tokens/s, per round: {_shown(alone)}")
    print(f"as written alone / free alone, tokens/s, per round: {_shown(written)}")
    print(f"free ITL beside a constrained stream / among four free, per round: {_shown(beside)}")


def _shown(ratios: list[float]) -> str:
    return " · ".join(f"{x:.2f}" for x in ratios) + f" (median {statistics.median(ratios):.2f})"


if __name__ == "__main__":
    main()
