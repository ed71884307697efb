"""`localserve monitor`: the live monitor of a running server, in this terminal.

tui (and Textual with it) is imported only when the command runs.

Tested in tests/unit/cli/test_cli.py and tests/e2e/test_monitor.py.
"""

from __future__ import annotations

import argparse

from localserve.cli.shared import add_url_arguments, log_to_file, server_url


def add(sub) -> None:
    mo = sub.add_parser(
        "monitor",
        help="the live monitor of a running server",
        description="Watch a running server live: queue, running set, TTFT, ITL, queue time, "
        "throughput, KV-cache occupancy, and what limits it now, in plain words. q quits.",
    )
    add_url_arguments(mo)
    mo.add_argument("--monitor-token", help="the server's monitor token, if it has one")
    mo.add_argument("--name", help="say hello as this user (servers that require tokens)")
    mo.add_argument("--token", help="that user's token")
    mo.set_defaults(run=cmd_monitor)


def cmd_monitor(args: argparse.Namespace) -> int:
    from tui.monitor import MonitorApp
    from tui.source import WebSocketSource

    log_to_file("monitor")
    url = server_url(args)
    source = WebSocketSource(url, args.monitor_token, args.name, args.token)
    MonitorApp(source, url).run()
    return 0
