"""`localserve sweep`: concurrency x workload x policy on one loaded model, written as a table,
JSON and a chart.

Tested in tests/unit/cli/test_cli.py and tests/unit/bench/test_sweep.py.
"""

from __future__ import annotations

import argparse

from localserve.cli.shared import add_model_argument, model_name
from localserve.config import load_config


def add(sub) -> None:
    sw = sub.add_parser(
        "sweep",
        help="concurrency x workload x policy sweep, table and chart",
        description="Serve the model here under each scheduling policy and measure each workload "
        "at each concurrency: a table and an SVG chart in the output folder.",
    )
    add_model_argument(sw)
    sw.add_argument(
        "--policies", default="continuous,static", help="comma-separated (default %(default)s)"
    )
    sw.add_argument(
        "--workloads", default="chat,mixed", help="comma-separated (default %(default)s)"
    )
    sw.add_argument(
        "--concurrency", default="1,2,4,8,16", help="comma-separated (default %(default)s)"
    )
    sw.add_argument(
        "--num-requests",
        type=int,
        default=16,
        help="per point, at least twice the concurrency (default %(default)s)",
    )
    sw.add_argument("--seed", type=int, default=0, help="workload seed (default %(default)s)")
    sw.add_argument(
        "--out-dir", default="bench-results", help="where the results go (default %(default)s)"
    )
    sw.set_defaults(run=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from localserve.bench.sweep import run_sweep, write_results
    from localserve.runners.models import open_runner

    config = load_config(args.config)
    name = model_name(config, args.model)
    runner = open_runner(config, name)
    try:
        points = run_sweep(
            config,
            runner,
            name,
            args.policies.split(","),
            args.workloads.split(","),
            [int(c) for c in args.concurrency.split(",")],
            args.num_requests,
            args.seed,
        )
    finally:
        runner.close()
    out = write_results(points, args.out_dir)
    print((out / "sweep.md").read_text())
    print(f"written: {out}/sweep.json, sweep.md, sweep.svg")
    return 0
