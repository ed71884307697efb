"""`localserve sweep`: concurrency x workload x policy on one loaded model, written as a table,
JSON and a chart.

Tested in tests/unit/cli/test_cli.py and tests/unit/bench/test_sweep.py.
"""

from __future__ import annotations

import argparse

from localserve.cli.shared import add_model_argument, counts, model_name, positive_int
from localserve.config import ConfigError, load_config


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
        "--concurrency",
        type=counts,
        default="1,2,4,8,16",
        help="comma-separated (default %(default)s)",
    )
    sw.add_argument(
        "--num-requests",
        type=positive_int,
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
    policies, workloads = _known(args.policies, args.workloads)
    runner = open_runner(config, name)
    try:
        points = run_sweep(
            config,
            runner,
            name,
            policies,
            workloads,
            args.concurrency,
            args.num_requests,
            args.seed,
        )
    finally:
        runner.close()
    out = write_results(points, args.out_dir)
    print((out / "sweep.md").read_text())
    print(f"written: {out}/sweep.json, sweep.md, sweep.svg")
    return 0


def _known(policies: str, workloads: str) -> tuple[list[str], list[str]]:
    """The --policies and --workloads asked for, each checked before the model loads."""
    import typing

    from localserve.bench.workloads import WORKLOADS
    from localserve.config import SchedulerConfig

    known = typing.get_args(typing.get_type_hints(SchedulerConfig)["policy"])
    asked = {
        "--policies": (policies.split(","), known),
        "--workloads": (workloads.split(","), WORKLOADS),
    }
    for flag, (names, names_known) in asked.items():
        if unknown := [n for n in names if n not in names_known]:
            raise ConfigError(f"{flag}: {', '.join(unknown)}: not one of {', '.join(names_known)}")
    return asked["--policies"][0], asked["--workloads"][0]
