"""What keeping cached prefixes costs live requests: llama.cpp's attention window.

llama.cpp attends over every cell up to the highest one in use (masking the others), so cells
kept for cached prefixes widen the window for everyone. This measures one fresh request (a
2,000-token prompt, 64 greedy tokens) on an empty cache and after three other users' finished
2,000-token conversations were kept as cached prefixes (~6,000 of 8,192 cells), and the same
with prefix caching off (their cells freed). One warm-up, then the three cases interleaved,
REPEATS (3) times, in this process on the models.toml default model. Run on a quiet machine:

    .venv/bin/python benchmarks/prefix_cache_window_cost.py

Prints one markdown table: per case, the fresh request's TTFT and TPOT (medians).
Figures: docs/benchmarks.md, "Prefix caching: multi-turn TTFT (issue 6)", "What cached
prefixes cost others".
"""

from __future__ import annotations

import statistics

import msgspec

from localserve.bench.scenario import pages
from localserve.config import load_config
from localserve.engine.engine import Engine
from localserve.engine.events import Done
from localserve.engine.sampling_params import SamplingParams
from localserve.runners.models import open_runner

REPEATS = 3


def prompt(runner, n: int = 2000) -> list[int]:
    """The same text for everyone: they are different users, so nothing is reused."""
    return runner.tokenize("\n\n".join(pages()))[:n]


def measure(runner, config, fill: bool) -> tuple[float, float]:
    """(TTFT ms, TPOT ms) of the fresh request."""
    events: list = []
    engine = Engine(runner, config, on_events=events.extend)
    if fill:
        one = SamplingParams(max_tokens=1)
        for i in range(3):
            engine.add_request(f"old{i}", prompt(runner), one, user=f"u{i}")
            engine.step()
            while engine.scheduler.has_work:
                engine.step()
    greedy = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    engine.add_request("fresh", prompt(runner), greedy, user="fresh")
    engine.step()
    while engine.scheduler.has_work:
        engine.step()
    done = next(e for e in events if isinstance(e, Done) and e.request_id == "fresh")
    return done.timings["ttft_ms"], done.timings["itl_ms"]


def main() -> None:
    config = load_config()
    runner = open_runner(config, config.default)
    cases = [
        (True, False, "empty cache"),
        (True, True, "~6,000 cells of cached prefixes"),
        (False, True, "prefix caching off (same three requests first)"),
    ]
    measure(runner, config.scheduler, False)  # warm up: page in the weights
    runs: dict[str, list[tuple[float, float]]] = {label: [] for _, _, label in cases}
    for _ in range(REPEATS):  # interleaved, so drift hits every case alike
        for caching, fill, label in cases:
            scheduler = msgspec.structs.replace(config.scheduler, prefix_caching=caching)
            runs[label].append(measure(runner, scheduler, fill))
    print("| cache before the request | TTFT (2,000 tokens) | TPOT (64 tokens) |")
    print("|---|---:|---:|")
    for label, results in runs.items():
        ttft = statistics.median(r[0] for r in results)
        tpot = statistics.median(r[1] for r in results)
        print(f"| {label} | {ttft:,.0f} ms | {tpot:.1f} ms |")
    runner.close()


if __name__ == "__main__":
    main()
