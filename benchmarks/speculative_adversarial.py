"""Can one user's drafts slow the others? (issue 37) The engine in-process on the embedded model,
greedy, four light users (one chat each) beside a hostile user with eight streams built so that
n-gram drafts keep being proposed and keep failing: a prompt of 1,500 words drawn at random from
six (every bigram has been followed by each of them, so every suffix finds a draft) and a reply
with the strongest presence and frequency penalties (2.0: every token already written is pushed
down, and a draft is made of tokens already written), in rounds that alternate speculation off
and on. (A hot sampled reply was tried first: the model still copied the list, and its drafts
were kept.) Reported for
the light users: their output tokens/s and mean gap per token (TPOT), and for the hostile
streams their draft tokens and acceptance, so the cost of drafts that fail shows up as the
light users' loss, if any.

    .venv/bin/python benchmarks/speculative_adversarial.py [--rounds 3] [--tokens 96] [--out F]

Figures: docs/benchmarks.md, "Speculative decoding".
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import msgspec

from localserve.config import ModelConfig, SchedulerConfig
from localserve.engine.engine import Engine
from localserve.engine.events import Done, Token
from localserve.engine.sampling_params import SamplingParams
from localserve.runners.llama import LlamaRunner
from localserve.runners.models import ensure_embedded

LIGHT = [
    "Explain in a few sentences why the sky is blue.",
    "Write a short story about a lighthouse keeper.",
    "What are the main causes of inflation?",
    "Describe how a bicycle works.",
]
WORDS = ["cat", "dog", "fish", "bird", "horse", "mouse"]


def chat(text: str) -> str:
    return f"<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n"


def hostile_prompt(seed: int) -> str:
    rng = random.Random(seed)
    words = " ".join(rng.choice(WORDS) for _ in range(1500))
    return chat(f"{words}\n\nContinue this list of words.")


def run(runner, speculative: str, tokens: int, hostile: bool) -> dict:
    times: dict[str, list[float]] = {}
    done: dict[str, Done] = {}

    def on_events(events):
        now = time.perf_counter()
        for e in events:
            if isinstance(e, Token):
                times.setdefault(e.request_id, []).append(now)
            elif isinstance(e, Done):
                done[e.request_id] = e

    engine = Engine(runner, SchedulerConfig(speculative=speculative), on_events=on_events)
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    for i, text in enumerate(LIGHT):
        engine.add_request(f"light{i}", runner.tokenize(chat(text)), params, user=f"light{i}")
    if hostile:
        hot = SamplingParams(
            temperature=0,
            presence_penalty=2.0,
            frequency_penalty=2.0,
            max_tokens=tokens,
            ignore_eos=True,
        )
        for i in range(8):
            prompt = runner.tokenize(hostile_prompt(i))
            engine.add_request(
                f"hostile{i}", prompt, msgspec.structs.replace(hot, seed=i), user="hostile"
            )
    engine.step()
    while engine.scheduler.has_work:
        engine.step()
    light = [r for r in done if r.startswith("light")]
    tpot = [done[r].timings["itl_ms"] for r in light]
    tok_s = [tokens / (times[r][-1] - start) for r in light]
    c = engine.snapshot().result().counters
    return {
        "light_tpot_ms": statistics.mean(tpot),
        "light_tok_s": statistics.mean(tok_s),
        "draft_tokens": c.spec_draft_tokens,
        "accepted": c.spec_accepted_tokens,
        "drafts": c.spec_drafts,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    cfg = ModelConfig(
        embedded=True, chat_template="gemma", n_ctx=32768, max_num_seqs=16, n_threads=2
    )
    runner = LlamaRunner("gemma-3-270m", ensure_embedded(), cfg)
    results: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        order = [("off", True), ("ngram", True), ("off", False)]
        for spec, hostile in order if r % 2 == 0 else order[::-1]:
            key = f"{'hostile' if hostile else 'alone'}-{spec}"
            results.setdefault(key, []).append(run(runner, spec, args.tokens, hostile))
            print(key, results[key][-1], flush=True)
    print("\n| light users | speculation | tok/s each | TPOT ms | draft tokens | accepted |")
    print("|---|---|---:|---:|---:|---:|")
    for key, rows in results.items():
        where, spec = key.split("-")
        tok_s = statistics.median(x["light_tok_s"] for x in rows)
        tpot = statistics.median(x["light_tpot_ms"] for x in rows)
        drafted = statistics.median(x["draft_tokens"] for x in rows)
        accepted = statistics.median(x["accepted"] for x in rows)
        beside = "beside 8 hostile streams" if where == "hostile" else "alone"
        print(f"| {beside} | {spec} | {tok_s:.1f} | {tpot:.1f} | {drafted:.0f} | {accepted:.0f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    runner.close()


if __name__ == "__main__":
    main()
