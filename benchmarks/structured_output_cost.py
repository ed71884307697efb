"""What does one user's structured output cost the others, and itself (issue 28)?

16 streams on the real engine (in-process, the embedded model, 2 threads), of which 0, 1 and 4
are constrained by a JSON schema (a realistic pydantic model), side by side, alternating the
three runs `--rounds` times. Reports each run's unconstrained streams' mean ITL against the
all-free run (target: within 5%), the constrained requests' own ITL, the schema's compile time
(server side: checks + llguidance validation; engine side: the matcher), the mask's cost per
token (computed on a mask thread during the decode) and what of it the engine thread still
waits for, and the same with a hostile schema (200 alternatives, within every bound) among 15
free streams.

Run: .venv/bin/python benchmarks/structured_output_cost.py [--rounds 2] [--tokens 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic import BaseModel, Field  # noqa: E402

from localserve.chat.constraints import ConstraintCompiler  # noqa: E402
from localserve.config import ModelConfig, SchedulerConfig  # noqa: E402
from localserve.engine.engine import Engine  # noqa: E402
from localserve.engine.events import Done  # noqa: E402
from localserve.engine.sampling_params import SamplingParams  # noqa: E402
from localserve.runners.grammar import Constrained  # noqa: E402
from localserve.runners.llama import LlamaRunner  # noqa: E402
from localserve.runners.models import ensure_embedded  # noqa: E402


class Person(BaseModel):
    name: str = Field(max_length=30)
    age: int = Field(ge=0, le=150)
    role: str = Field(json_schema_extra={"enum": ["admin", "user", "guest"]})
    tags: list[str] = Field(max_length=4)


# within every bound the server checks, yet costly per token: 200 alternative objects
HOSTILE = {
    "anyOf": [
        {"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}
        for i in range(200)
    ]
}


def one_run(runner, constraint, n_constrained: int, tokens: int) -> dict:
    events: list = []
    engine = Engine(runner, SchedulerConfig(), on_events=events.extend)
    masks, waits = [], []
    prompt = runner.tokenize("A person, as JSON:")
    for i in range(16):
        c = constraint if i < n_constrained else None
        params = SamplingParams(max_tokens=tokens, temperature=0.7, seed=i, constraint=c)
        engine.add_request(f"r{i}", prompt, params, user=f"u{i}")

    def watch():
        for seq in engine._seqs.values():
            sampler = seq.sampler
            if isinstance(sampler, Constrained) and sampler.num_masks:
                masks.append(sampler.compute_s / sampler.num_masks)
                waits.append(sampler.wait_s / sampler.num_masks)

    cpu, sample_s, decode_s, steps = time.process_time(), 0.0, 0.0, 0
    engine.step()  # the requests are commands until a step drains them
    while engine.scheduler.has_work:
        engine.step()
        watch()
        sample_s += runner.timings.sample_s
        decode_s += runner.timings.decode_s
        steps += 1
    cpu = time.process_time() - cpu
    dones = {e.request_id: e for e in events if isinstance(e, Done)}
    free = [d.timings["itl_ms"] for r, d in dones.items() if int(r[1:]) >= n_constrained]
    bound = [d for r, d in dones.items() if int(r[1:]) < n_constrained]
    num_tokens = sum(d.completion_tokens for d in dones.values())
    return {
        "sample_ms_per_step": sample_s / steps * 1e3,
        "decode_ms_per_step": decode_s / steps * 1e3,
        "cpu_ms_per_token": cpu / num_tokens * 1e3,
        "free_itl_ms": statistics.mean(x for x in free if x),
        "constrained_itl_ms": statistics.mean(d.timings["itl_ms"] for d in bound)
        if bound
        else None,
        "constrained_finish": [d.finish_reason for d in bound],
        "mask_ms": statistics.mean(masks) * 1e3 if masks else None,
        "wait_ms": statistics.mean(waits) * 1e3 if waits else None,
    }


def _mean(runs: list[dict], key: str) -> float | None:
    values = [x[key] for x in runs if x[key] is not None]
    return statistics.mean(values) if values else None


def report(results: dict[str, list]) -> None:
    base = statistics.median(x["free_itl_ms"] for x in results["0 of 16"])
    print(
        "\n| run | free streams' ITL ms (median) | vs all-free | sampling ms/step "
        "| decode ms/step | process CPU ms/token | constrained ITL ms "
        "| mask compute ms/token | engine-thread wait ms/token | constrained finish |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, runs in results.items():
        free = statistics.median(x["free_itl_ms"] for x in runs)
        keys = ("sample_ms_per_step", "decode_ms_per_step", "cpu_ms_per_token")
        keys += ("constrained_itl_ms", "mask_ms", "wait_ms")
        cells = [_mean(runs, k) for k in keys]
        shown = ["-" if c is None else f"{c:.2f}" for c in cells]
        finish = ", ".join(sorted({f for x in runs for f in x["constrained_finish"]})) or "-"
        print(
            f"| {label} | {free:.1f} | {100 * (free / base - 1):+.1f}% | "
            + " | ".join(shown)
            + f" | {finish} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    cfg = ModelConfig(embedded=True, n_ctx=4096, max_num_seqs=16, max_num_batched_tokens=512)
    runner = LlamaRunner("gemma-3-270m", ensure_embedded(), cfg)
    compiler = ConstraintCompiler()
    start = time.perf_counter()
    constraint = compiler.compile_sync("json_schema", Person.model_json_schema())
    print(
        f"server-side compile (checks + validation): {(time.perf_counter() - start) * 1e3:.1f} ms"
    )
    start = time.perf_counter()
    runner._grammar.new_sampler(None, constraint)._ready()  # tokenizer (once) and the matcher
    print(f"engine-side tokenizer + first matcher: {time.perf_counter() - start:.2f} s")
    start = time.perf_counter()
    runner._grammar._matcher(constraint)
    print(f"engine-side matcher (cached): {(time.perf_counter() - start) * 1e3:.2f} ms")
    hostile = compiler.compile_sync("json_schema", HOSTILE)
    results: dict[str, list] = {}
    for r in range(args.rounds):
        runs = (
            ("0 of 16", None, 0),
            ("1 of 16", constraint, 1),
            ("4 of 16", constraint, 4),
            ("1 hostile of 16", hostile, 1),
        )
        for label, c, n in runs:
            out = one_run(runner, c, n, args.tokens)
            results.setdefault(label, []).append(out)
            print(f"round {r} {label}: {out}", flush=True)
    report(results)
    runner.close()


if __name__ == "__main__":
    main()
