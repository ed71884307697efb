"""`localserve bench-engine`: the engine's decode throughput against bare llama_decode.

Tested in tests/e2e/test_engine_benchmark.py.
"""

from __future__ import annotations

import argparse

from localserve.cli.shared import add_model_argument, counts, positive_int
from localserve.config import load_config


def add(sub) -> None:
    b = sub.add_parser(
        "bench-engine",
        help="engine vs bare llama_decode throughput benchmark",
        description="Load the model here and measure the engine against the least Python a "
        "decode loop can have, side by side at each concurrency (docs/benchmarks.md).",
    )
    add_model_argument(b)
    b.add_argument(
        "--concurrency",
        type=counts,
        default="1,4,8,16",
        help="comma-separated sequence counts (default %(default)s)",
    )
    b.add_argument(
        "--tokens",
        type=positive_int,
        default=64,
        help="decode steps per measurement (default %(default)s)",
    )
    b.add_argument(
        "--prefill-tokens",
        type=positive_int,
        default=2048,
        help="the prompt of the prefill measurement, in tokens (default %(default)s)",
    )
    b.add_argument("--out", help="write the results as JSON here")
    b.set_defaults(run=cmd_bench_engine)


def cmd_bench_engine(args: argparse.Namespace) -> int:
    from localserve.bench.engine import run_benchmark

    config = load_config(args.config)
    return run_benchmark(
        config, args.model, args.concurrency, args.tokens, args.out, args.prefill_tokens
    )
