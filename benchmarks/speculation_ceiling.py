"""How far could drafts take a point of the speculation benchmark, at best? (issue 52)

A drafted step still computes a logit row for every token it keeps: on a CPU that row (the
output projection over Gemma 3's 262,144-token vocabulary) costs several milliseconds, and the
prompt's prefill costs the same with speculation on and off. So speculation on ÷ off has a
ceiling that no drafter can pass, however right its drafts:

    ceiling = (P + D) / (P + T * c)

P: the time of the steps that carry a prompt's chunk, D: of the decode-only steps, T: the tokens
those give (speculation off, the engine in-process on the real model, every request of the point
at once, as the closed loop's first requests arrive); c: the least time a kept token can cost,
a step of the point's N sequences each at its prompt's length + half the reply, carrying the
most draft rows a step may (`draft_rows`, 48 for the embedded model), every one kept:
step time / (N + 48). `floor` also prints the marginal row ((t(48) - t(32)) / 16): what a token
would cost with any number of draft rows, the ceiling's asymptote. Then the same point with
speculation on, for where the drafts of today land against it.

    .venv/bin/python benchmarks/speculation_ceiling.py --workload edit --users 1 4

Prompts: localserve/bench/workloads.py's, rendered as the server renders the embedded model's
chats ("transcript"); greedy, --tokens out (256) with ignore_eos, as benchmarks/
speculative_decoding.sh. Figures: docs/benchmarks.md, "What drafts could reach on this CPU".
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import llama_cpp
import msgspec

from localserve.bench.workloads import build_requests
from localserve.config import load_config
from localserve.engine.engine import Engine
from localserve.engine.sampling_params import SamplingParams
from localserve.engine.speculative import NgramDrafter
from localserve.runners.models import ensure_embedded, open_runner
from localserve.serve.prompt import render_transcript

CTX = 65536  # as the speculation benchmark's servers


def configured(spec: str):
    config = load_config()
    model = config.models[config.default]
    models = {**config.models, config.default: msgspec.structs.replace(model, n_ctx=CTX)}
    scheduler = config.scheduler
    if spec == "off":
        scheduler = msgspec.structs.replace(scheduler, speculative="off")
    return msgspec.structs.replace(config, models=models, scheduler=scheduler)


def model_config():
    """The served model's settings (models.toml's default)."""
    config = load_config()
    return config.models[config.default]


def run_point(spec: str, workload: str, users: int, seed: int, tokens: int) -> dict:
    """Every request of the point at once; the steps' times, split by whether a prompt's chunk
    rides in them."""
    config = configured(spec)
    runner = open_runner(config, config.default)
    eng = Engine(runner, config.scheduler, on_events=lambda evs: None)
    steps: list[tuple[bool, float, int]] = []
    seen: dict[str, object] = {}  # the sequences stepped, by request id, for their tokens
    run = eng._run

    def timed(batch):
        seen.update((item.seq.request_id, item.seq) for item in batch.items)
        t = time.perf_counter()
        out = run(batch)
        steps.append((batch.num_prefill_tokens > 0, time.perf_counter() - t, len(out)))
        return out

    def serve(prompts: list[list[int]], n: int, tag: str) -> float:
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        for i, p in enumerate(prompts):
            eng.add_request(f"{tag}{i}", p, params, user=f"{tag}{i}")
        t = time.perf_counter()
        eng.step()
        while eng.scheduler.has_work:
            eng.step()
        return time.perf_counter() - t

    def tokenized(specs) -> list[list[int]]:
        chats = [[*s.history, ("user", s.prompt)] for s in specs]
        return [runner.tokenize(render_transcript(c)) for c in chats]

    eng._run = timed
    serve(tokenized(build_requests(workload, 1, seed=seed + 1000, max_tokens=32)), 32, "w")
    steps.clear()
    prompts = tokenized(build_requests(workload, users, seed=seed, max_tokens=tokens))
    total = serve(prompts, tokens, "r")
    # (by id: two users of the multi-turn workload may send the same prompt)
    outputs = [seen[f"r{i}"].tokens[len(p) :] for i, p in enumerate(prompts)]
    runner.close()  # (its context's memory, before the next point's)
    pre, dec = [s for s in steps if s[0]], [s for s in steps if not s[0]]
    return {
        "total": total,
        "P": sum(s[1] for s in pre),
        "D": sum(s[1] for s in dec),
        "T": sum(s[2] for s in dec),
        "lengths": [len(p) for p in prompts],
        "copyable": copyable(prompts, outputs),
    }


def copyable(prompts: list[list[int]], outputs: list[list[int]]) -> float:
    """The share of the replies' tokens today's drafter proposes right, drafting 48 at every
    position where it proposes anything (a step keeps the draft's agreeing head, then the
    target's own token): the replies' text decides it, not the planner."""
    kept = total = 0
    for prompt, out in zip(prompts, outputs, strict=True):
        drafter, i = NgramDrafter(), 0
        while i < len(out):
            draft = drafter.propose(prompt + out[:i], 48)
            n = next(
                (j for j, (d, o) in enumerate(zip(draft, out[i:], strict=False)) if d != o), None
            )
            n = min(len(draft), len(out) - i) if n is None else n
            kept, i = kept + n, i + n + 1
        total += len(out)
    return kept / max(total, 1)


def kept_token_cost(lengths: list[int], at: int, rows: int) -> tuple[float, float]:
    """(c, floor): the least time a kept token costs in a step of len(lengths) sequences at
    their prompt's length + at, with `rows` draft rows between them, all kept; and the marginal
    draft row (what the 16 rows past rows - 16 add, per row)."""
    model_params = llama_cpp.llama_model_default_params()
    model_params.use_extra_bufts = False
    model = llama_cpp.llama_model_load_from_file(str(ensure_embedded()).encode(), model_params)
    p = llama_cpp.llama_context_default_params()
    p.n_ctx = sum(lengths) + len(lengths) * (at + rows + 64)
    p.n_batch = p.n_ubatch = 512
    p.n_seq_max = max(len(lengths), 1)
    p.kv_unified = True
    p.n_threads = p.n_threads_batch = model_config().n_threads or os.cpu_count() or 1
    p.no_perf = True
    ctx = llama_cpp.llama_init_from_model(model, p)
    mem = llama_cpp.llama_get_memory(ctx)
    batch = llama_cpp.llama_batch_init(512, 0, 1)

    def decode(items: list[tuple[int, int, int]], logits: bool) -> float:  # (seq, start, n)
        n = 0
        for seq, start, k in items:
            for j in range(k):
                batch.token[n], batch.pos[n] = 100 + (start + j) % 1000, start + j
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0], batch.logits[n] = seq, int(logits or j == k - 1)
                n += 1
        batch.n_tokens = n
        t = time.perf_counter()
        assert llama_cpp.llama_decode(ctx, batch) == 0
        return time.perf_counter() - t

    for seq, length in enumerate(lengths):  # the prompts and half the reply, in 512s
        for start in range(0, length + at, 512):
            decode([(seq, start, min(512, length + at - start))], False)

    def step(extra: int) -> float:  # each sequence its last token and its share of the drafts
        shares = [extra // len(lengths) + (i < extra % len(lengths)) for i in range(len(lengths))]
        times = []
        for _ in range(5):
            items = [
                (s, length + at, 1 + k)
                for s, (length, k) in enumerate(zip(lengths, shares, strict=True))
            ]
            times.append(decode(items, True))
            for s, length in enumerate(lengths):
                llama_cpp.llama_memory_seq_rm(mem, s, length + at, -1)
        return statistics.median(times)

    full = step(rows)
    floor = (full - step(rows - 16)) / 16
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return full / (len(lengths) + rows), floor


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--workload", default="edit")
    a.add_argument("--users", type=int, nargs="+", default=[1, 4])
    a.add_argument("--tokens", type=int, default=256)
    a.add_argument("--seed", type=int, default=7)
    args = a.parse_args()
    rows = model_config().draft_rows
    print(
        "| users | prompts (tokens) | P (s) | D (s) | T | c (ms) | floor (ms) | ceiling "
        "| at floor | copyable | on: P, D (s) | on ÷ off here |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for users in args.users:
        off = run_point("off", args.workload, users, args.seed, args.tokens)
        on = run_point("on", args.workload, users, args.seed, args.tokens)
        c, floor = kept_token_cost(off["lengths"], args.tokens // 2, rows)
        P, D, T = off["P"], off["D"], off["T"]
        print(
            f"| {users} | {', '.join(map(str, off['lengths']))} | {P:.2f} | {D:.2f} | {T} "
            f"| {c * 1e3:.1f} | {floor * 1e3:.1f} | {(P + D) / (P + T * c):.2f}× "
            f"| {(P + D) / (P + T * floor):.2f}× | {off['copyable']:.0%} "
            f"| {on['P']:.2f}, {on['D']:.2f} "
            f"| {off['total'] / on['total']:.2f}× |",
            flush=True,
        )


if __name__ == "__main__":
    main()
