"""`localserve worker`: lend this machine's CPU or GPUs to a server elsewhere, as a llama.cpp
RPC server.

Tested in tests/unit/cli/test_cli.py and tests/e2e/test_rpc_workers.py.
"""

from __future__ import annotations

import argparse
import sys
import time

from localserve.cli.shared import port_number, positive_int
from localserve.config import ConfigError

RPC_WARNING = (
    "WARNING: llama.cpp's RPC protocol has no authentication and no encryption: anyone who can "
    "reach {endpoint} can run computations on this machine's devices, fill its memory and see "
    "every tensor that passes. Lend a machine this way only on a network you trust (a home LAN "
    "behind its router), never on the internet."
)


def add(sub) -> None:
    w = sub.add_parser(
        "worker",
        help="lend this machine's CPU or GPUs to a server elsewhere (llama.cpp RPC)",
        description="Run a llama.cpp RPC worker: a server elsewhere (its rpc_workers in "
        "models.toml) puts layers of its model on this machine's devices.",
    )
    w.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    w.add_argument("--port", type=port_number, default=50052, help="port (default %(default)s)")
    w.add_argument(
        "--allow-network", action="store_true", help="listen on an address other than loopback"
    )
    w.add_argument(
        "--device",
        action="append",
        default=[],
        help="a device to lend (repeatable; default: every GPU, else the CPU); see --list",
    )
    w.add_argument("--list", action="store_true", help="list this machine's devices and stop")
    w.add_argument(
        "--cache-dir",
        help="where received tensors are kept, so a restart does not resend the weights "
        "(default ~/.cache/localserve/rpc; 'off' keeps none)",
    )
    w.add_argument("--threads", type=positive_int, help="CPU threads (default: every core)")
    w.set_defaults(run=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    import os
    import signal
    import threading

    from localserve.ops.auth import is_loopback
    from localserve.runners import rpc
    from localserve.runners.models import cache_dir

    if not 0 < args.port < 65536:  # before the devices are listed (llama.cpp loads)
        raise ConfigError(f"--port {args.port}: a worker needs a port of its own, 1-65535")
    local = [d for d in rpc.devices() if not d.is_remote]
    if args.list:
        for d in local:
            print(f"{d.name:8s} {d.kind:4s} {d.total_bytes / 2**30:6.1f} GiB  {d.description}")
        return 0
    if not rpc.supports_rpc():
        raise ConfigError("this llama.cpp build has no RPC backend: run `make setup` again")
    endpoint = f"{args.host}:{args.port}"
    if not is_loopback(args.host):
        if not args.allow_network:
            raise ConfigError(
                f"refusing to listen on {args.host} without --allow-network: "
                + RPC_WARNING.format(endpoint=endpoint)
            )
        print(RPC_WARNING.format(endpoint=endpoint), file=sys.stderr, flush=True)
    names = args.device or [d.name for d in local if d.kind in ("GPU", "iGPU")] or ["CPU"]
    if unknown := [n for n in names if n not in {d.name for d in local}]:
        known = ", ".join(d.name for d in local)
        raise ConfigError(f"--device {', '.join(unknown)}: not on this machine ({known})")
    cache = None if args.cache_dir == "off" else args.cache_dir or str(cache_dir() / "rpc")
    if cache:
        os.makedirs(cache, exist_ok=True)
    threads = args.threads or os.cpu_count() or 1
    server = threading.Thread(
        target=rpc.start_server, args=(endpoint, cache, threads, names), daemon=True
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    deadline = time.monotonic() + 10
    while rpc.listening(args.port) is False and server.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)  # said only once it listens: a server may connect at once
    lent = ", ".join(f"{d.name} ({d.description})" for d in local if d.name in names)
    print(
        f"localserve worker: lending {lent} at {endpoint}"
        f"{f'; tensors cached in {cache}' if cache else ''} (Ctrl-C stops)",
        flush=True,
    )
    while not stop.wait(0.2):
        if not server.is_alive():
            print(f"localserve worker: the RPC server at {endpoint} stopped", file=sys.stderr)
            return 1
    # llama.cpp's RPC server has no stop: the process ends (its client sees the connection go)
    print("localserve worker: stopping", flush=True)
    sys.stdout.flush()
    os._exit(0)
