"""What committing a request's usage row before its `done` costs a client (issue 16).

    .venv/bin/python benchmarks/usage_done_latency.py [--requests 300]

One client, one request at a time, on the FakeRunner (so the engine costs next to nothing; the
server is localserve/bench/fake_server.py's `FakeServer`): the time from sending `chat` to
receiving `done`, with the usage record on (a temporary state directory) and off, alternating,
two rounds of --requests each. Prints two lines, usage off and on: chat -> done median and p99.
Figures: docs/benchmarks.md, "The usage record (issue 16)" and "The fault guarantees cost
nothing measurable (issue 25)".
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localserve.bench.blocking_ws import WS  # noqa: E402
from localserve.bench.fake_server import FakeServer  # noqa: E402


def run(requests: int, **config) -> list[float]:
    server = FakeServer(step_s=0.0, **config)
    try:
        ws = WS(server.url)
        ws.hello("bench")
        times = []
        for i in range(requests):
            started = time.perf_counter()
            ws.chat(f"r{i}", "hello there", max_tokens=2, ignore_eos=True)
            ws.until_done(f"r{i}")
            times.append(time.perf_counter() - started)
        return times
    finally:
        server.close()


def summary(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    return f"median {statistics.median(ms):6.2f} ms, p99 {ms[int(len(ms) * 0.99)]:6.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    results: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(2):
        for mode in ("off", "on"):
            with tempfile.TemporaryDirectory() as state:
                results[mode] += run(args.requests, state_dir=state, usage=mode == "on")
    for mode, times in results.items():
        print(f"usage {mode:3s}: chat -> done {summary(times)}")


if __name__ == "__main__":
    main()
