"""`localserve monitor`: the live monitor of a running server, in this terminal.

Without --monitor-token it sends the token the server keeps in the state directory (the same
one `serve` would use: --state-dir, models.toml's [server] state_dir, $LOCALSERVE_STATE_DIR,
XDG), when the server is on this machine; it never shows the token.

tui (and Textual with it) is imported only when the command runs.

Tested in tests/unit/cli/test_cli.py, tests/e2e/test_monitor.py and
tests/e2e/test_monitor_credential.py.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from urllib.parse import urlsplit

from localserve.cli.shared import add_url_arguments, log_to_file, server_url, team_options


def add(sub) -> None:
    mo = sub.add_parser(
        "monitor",
        help="the live monitor of a running server",
        description="Watch a running server live: queue, running set, TTFT, ITL, queue time, "
        "throughput, KV-cache occupancy, and what limits it now, in plain words. q quits. On "
        "the server's machine it finds the monitor token by itself.",
    )
    add_url_arguments(mo)
    mo.add_argument(
        "--monitor-token",
        help="the server's monitor token (default: the state dir's monitor_token, for a server "
        "on this machine)",
    )
    mo.add_argument("--state-dir", help="where the server keeps it (default [server] state_dir)")
    mo.add_argument(
        "--model",
        help="show this model's engine (default: the default model's; m switches to the next)",
    )
    mo.add_argument("--name", help="say hello as this user (servers that require tokens)")
    mo.add_argument("--token", help="that user's token")
    mo.set_defaults(run=cmd_monitor)


def cmd_monitor(args: argparse.Namespace) -> int:
    log_to_file("monitor")
    build_monitor(args).run()
    return 0


def build_monitor(args: argparse.Namespace):
    """The MonitorApp as `localserve monitor` runs it, its token found (tests drive it)."""
    from localserve.ops.monitor_token import read_token
    from tui.monitor import MonitorApp
    from tui.source import WebSocketSource

    url = server_url(args)
    path = monitor_token_file(args)
    token = args.monitor_token or (read_token(path) if is_this_machine(url) else None)
    source = WebSocketSource(
        url, token, args.name, args.token, monitor_token_file=str(path), model=args.model
    )
    return MonitorApp(source, url)


def monitor_token_file(args: argparse.Namespace) -> Path:
    """Where a server on this machine with these options keeps its monitor token."""
    from localserve.config import load_config
    from localserve.ops.monitor_token import token_file

    return token_file(team_options(load_config(args.config).server, args, {}))


def is_this_machine(url: str) -> bool:
    """The URL's host is this machine (loopback, or an address it can listen on): only then
    is the token kept here sent, never to another machine's server."""
    from localserve.ops.auth import is_loopback

    host = urlsplit(url).hostname or ""
    if is_loopback(host):
        return True
    try:
        addresses = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as s:
            try:
                s.bind((address[0], 0))
            except OSError:
                return False
    return bool(addresses)
