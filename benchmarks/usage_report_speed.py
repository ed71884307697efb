"""How fast the usage record answers with 100,000 rows (issue 16).

    .venv/bin/python benchmarks/usage_report_speed.py [--rows 100000]

Builds a database of `--rows` requests spread over 20 users and the last 30 days in a temporary
state directory, then times what reads it: the server's start-up (today's totals per user, for
quotas), `localserve usage` for today, 7 days, 30 days and one user, each the median of 5 runs,
and the whole `localserve usage --since 30d` command as a process.

Prints the database's build time and size, then one line per query with its time in ms.
Figures: docs/benchmarks.md, "The usage record (issue 16)".
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from localserve.config import ServerConfig
from localserve.ops import usage, usage_report


def build(path: Path, rows: int, now: float) -> None:
    db = usage.connect(path)
    rng = random.Random(0)
    users = [f"user{i:02d}" for i in range(20)]
    values = []
    for i in range(rows):
        prompt = rng.randint(10, 3000)
        values.append(
            usage.Row(
                finished=now - rng.random() * 30 * 86400,
                user=rng.choice(users),
                model="gemma-3-270m",
                request_id=f"{i // 50}:r{i}",
                client_id=f"r{i}",
                api=rng.choice(["websocket", "http"]),
                prompt_tokens=prompt,
                cached_tokens=rng.randint(0, prompt),
                completion_tokens=rng.randint(1, 500),
                queue_ms=rng.random() * 100,
                ttft_ms=rng.random() * 2000,
                e2e_ms=rng.random() * 20000,
                finish_reason=rng.choice(["stop", "length", "cancelled"]),
            ).values()
        )
    with db:
        db.executemany(usage.INSERT, values)
    db.close()


def timed(fn, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    now = time.time()
    with tempfile.TemporaryDirectory() as state:
        path = Path(state) / usage.DATABASE
        started = time.perf_counter()
        build(path, args.rows, now)
        print(f"built {args.rows:,} rows in {time.perf_counter() - started:.1f} s, "
              f"{path.stat().st_size / 2**20:.1f} MiB")  # fmt: skip
        db = usage.connect(path, readonly=True)
        cases = {
            "start-up: today's totals per user": lambda: usage.totals_since(
                db, usage.local_day_start(now)
            ),
            "usage (today)": lambda: usage_report.by_day(db, usage_report.parse_since("today", now)),
            "usage --since 7d": lambda: usage_report.by_day(db, usage_report.parse_since("7d", now)),
            "usage --since 30d": lambda: usage_report.by_day(db, usage_report.parse_since("30d", now)),
            "usage --since 30d --user user07": lambda: usage_report.by_day(
                db, usage_report.parse_since("30d", now), "user07"
            ),
        }
        for name, fn in cases.items():
            print(f"{name:36s} {timed(fn) * 1000:8.1f} ms")
        db.close()
        Usage = usage.Usage  # the server's own start-up, database checks included
        config = ServerConfig(state_dir=state)
        print(f"{'Usage() (quick_check, migrate, totals)':36s} "
              f"{timed(lambda: Usage(config, 'm').close()) * 1000:8.1f} ms")  # fmt: skip
        env = os.environ | {"LOCALSERVE_STATE_DIR": state}
        command = [sys.executable, "-m", "localserve", "usage", "--since", "30d"]
        wall = timed(lambda: subprocess.run(command, env=env, capture_output=True, check=True), 3)
        print(f"{'the whole command (a process)':36s} {wall * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
