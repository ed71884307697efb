"""Can one local process squatting on sockets shut out every other local user? (issue 25)

Starts `localserve serve` (the embedded model, default settings, a fresh state directory) as its
own process. A squatter, one local process, holds --sockets sockets (100) of one kind and opens
again at once each one the server closes, as an attacker would:

  idle       connected, nothing sent;
  half-open  a request head that never ends (`GET /healthz HTTP/1.1`, a header, no blank line);
  silent-ws  websockets that never say hello;
  mixed      a third of each.

Meanwhile another local user (from 127.0.0.2: all of loopback is one place, so rotating source
addresses helps neither side) makes --requests requests (40) one after another, each within
--timeout seconds (5): `GET /healthz`, then a websocket `hello` and a 2-token chat. Printed per
kind: the user's successes out of the requests, their latency (median, slowest), and how often
the server closed a squatter's socket. `--server-tree DIR` serves from another checkout (an
older commit, for the figures before a change).

    .venv/bin/python benchmarks/socket_squatter.py [--kinds idle,mixed] [--server-tree DIR]

Prints one markdown table, a row per kind (and "none", no squatter). Figures:
docs/benchmarks.md, "One place squatting on sockets (issue 25)".
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from localserve.bench.hostile import Squatter, healthy_from  # noqa: E402

PORT = 8797
HOST = "127.0.0.1"
USER_SOURCE = "127.0.0.2"
KINDS = (*Squatter.KINDS, "mixed")


def healthz(timeout: float) -> bool:
    return healthy_from(f"http://{HOST}:{PORT}", USER_SOURCE, timeout)


def chat(timeout: float) -> bool:
    sock = socket.create_connection((HOST, PORT), timeout=timeout, source_address=(USER_SOURCE, 0))
    try:
        with connect(f"ws://{HOST}:{PORT}", sock=sock, open_timeout=timeout) as ws:
            ws.send(json.dumps({"type": "hello", "user": "carol"}))
            if json.loads(ws.recv(timeout))["type"] != "welcome":
                return False
            messages = [{"role": "user", "content": "Hi"}]
            ws.send(json.dumps({"type": "chat", "id": "c", "max_tokens": 2, "messages": messages}))
            deadline = time.monotonic() + timeout
            while (frame := json.loads(ws.recv(deadline - time.monotonic())))["type"] != "done":
                pass
            return frame["finish_reason"] in ("stop", "length")
    except Exception:  # refused, reset, closed, late
        return False


def user(what, n: int, timeout: float) -> dict:
    """n requests one after another: successes and latencies."""
    times, ok = [], 0
    for _ in range(n):
        start = time.monotonic()
        if what(timeout):
            ok += 1
            times.append(time.monotonic() - start)
    return {"ok": ok, "n": n, "times": times}


def measure(kind: str | None, args) -> dict:
    squatter = Squatter(f"{HOST}:{PORT}", args.sockets, kind) if kind else None
    try:
        time.sleep(1)  # every socket opened
        result = {"healthz": user(healthz, args.requests, args.timeout)}
        result["chat"] = user(chat, args.requests, args.timeout)
    finally:
        if squatter:
            squatter.close()
    result["closed"] = squatter.num_closed if squatter else 0
    return result


def start_server(args) -> subprocess.Popen:
    state = tempfile.mkdtemp(prefix="socket_squatter-")
    env = os.environ | {"LOCALSERVE_STATE_DIR": state}
    if args.server_tree:
        env["PYTHONPATH"] = args.server_tree
    cmd = [sys.executable, "-m", "localserve", "serve", "--port", str(PORT)]
    server = subprocess.Popen(
        cmd, cwd=args.server_tree or None, env=env, stdout=subprocess.DEVNULL, stderr=args.log
    )
    for _ in range(240):
        try:
            urllib.request.urlopen(f"http://{HOST}:{PORT}/healthz", timeout=1)
            return server
        except OSError:
            time.sleep(0.5)
    raise SystemExit("the server did not start")


def _ms(xs: list[float], f) -> str:
    return f"{1e3 * f(xs):.0f} ms" if xs else "-"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sockets", type=int, default=100)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--server-tree", help="serve from this checkout (e.g. an older commit)")
    parser.add_argument("--server-log", help="the server's stderr to this file")
    args = parser.parse_args()
    args.log = open(args.server_log, "w") if args.server_log else subprocess.DEVNULL  # noqa: SIM115
    server = start_server(args)
    rows = []
    try:
        for kind in [None, *args.kinds.split(",")]:
            rows.append((kind or "none", measure(kind, args)))
            print(f"{kind or 'none'}: done", file=sys.stderr, flush=True)
    finally:
        server.terminate()
        server.wait(60)
    print(
        f"| squatter ({args.sockets} sockets) | /healthz ok | median | slowest "
        "| hello + chat ok | median | slowest | squatter sockets closed |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for kind, r in rows:
        h, c = r["healthz"], r["chat"]
        print(
            f"| {kind} | {h['ok']}/{h['n']} | {_ms(h['times'], statistics.median)} | "
            f"{_ms(h['times'], max)} | {c['ok']}/{c['n']} | {_ms(c['times'], statistics.median)} "
            f"| {_ms(c['times'], max)} | {r['closed']} |"
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
