"""The terminal commands `localserve demo`, `monitor` and `chat`.

localserve's command line finds them through the entry-point group `localserve.commands`
(pyproject.toml): localserve never imports this package. Each `add_*` adds its subcommand to
localserve's subparsers; nothing here loads Textual until a command runs.
"""

from __future__ import annotations

import argparse
import contextlib

from localserve.cli import NO_PREFIX_CACHE_HELP, add_model_argument

DEFAULT_URL = "ws://127.0.0.1:8765"


def add_url_arguments(p: argparse.ArgumentParser) -> None:
    """The server's URL, as `monitor URL` or `monitor --url URL` (the same for chat)."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("url", nargs="?", help=f"the server's websocket URL (default {DEFAULT_URL})")
    where.add_argument("--url", dest="url_option", metavar="URL", help="the same, as an option")


def server_url(args: argparse.Namespace) -> str:
    return args.url or args.url_option or DEFAULT_URL


# --- demo ----------------------------------------------------------------------------------------


def add_demo(sub) -> None:
    d = sub.add_parser("demo", help="server + monitor + four people sharing one model")
    add_model_argument(d)
    d.add_argument("--seed", type=int, default=0, help="varies the scenario's prompts and pauses")
    d.add_argument("--pace", type=float, default=1.0, help="scales the scenario's pauses")
    d.add_argument("--screenshot", metavar="SVG", help="run headless; save the screen to SVG")
    d.add_argument("--after", type=float, default=40.0, help="seconds before the screenshot")
    d.add_argument("--no-prefix-cache", action="store_true", help=NO_PREFIX_CACHE_HELP)
    d.set_defaults(run=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """Serve the model in-process, play the four-person scenario, show the monitor."""
    import asyncio
    import tempfile

    import msgspec

    from localserve.bench.scenario import play
    from localserve.cli import log_to_file, prefix_cache_option, say_where
    from localserve.config import load_config
    from localserve.serve.serving import serving
    from tui.app import MonitorApp
    from tui.source import WebSocketSource

    log_path = log_to_file("demo")
    config = prefix_cache_option(load_config(args.config), args.no_prefix_cache)
    # the demo's people are not real users: their usage goes to a state directory of its own
    state = tempfile.TemporaryDirectory(prefix="localserve-demo-")
    config.server = msgspec.structs.replace(config.server, state_dir=state.name)
    with state, serving(config, args.model, thread=True) as served:
        say_where(served.runner)
        thread, server = served.thread, served.server
        stop = asyncio.Event()
        scenario = asyncio.run_coroutine_threadsafe(
            play(thread.url, stop, seed=args.seed, pace=args.pace), thread.loop
        )
        app = MonitorApp(WebSocketSource(thread.url), thread.url)
        try:
            if args.screenshot:
                asyncio.run(_screenshot(app, args.screenshot, args.after))
            else:
                app.run()
        finally:
            thread.loop.call_soon_threadsafe(stop.set)
            with contextlib.suppress(Exception):
                scenario.result(timeout=10)
            server.config = msgspec.structs.replace(server.config, shutdown_grace_s=0)
    print(f"localserve demo: stopped (log: {log_path})")
    return 0


async def _screenshot(app, path: str, after_s: float) -> None:
    """The monitor, headless at 120x36, after the scenario has played for a while."""
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause(after_s)
        app.save_screenshot(path)


# --- monitor -------------------------------------------------------------------------------------


def add_monitor(sub) -> None:
    mo = sub.add_parser("monitor", help="the live monitor of a running server")
    add_url_arguments(mo)
    mo.add_argument("--monitor-token", help="the server's monitor token, if it has one")
    mo.add_argument("--name", help="say hello as this user (servers that require tokens)")
    mo.add_argument("--token", help="that user's token")
    mo.set_defaults(run=cmd_monitor)


def cmd_monitor(args: argparse.Namespace) -> int:
    from localserve.cli import log_to_file
    from tui.app import MonitorApp
    from tui.source import WebSocketSource

    log_to_file("monitor")
    url = server_url(args)
    source = WebSocketSource(url, args.monitor_token, args.name, args.token)
    MonitorApp(source, url).run()
    return 0


# --- chat ----------------------------------------------------------------------------------------


def add_chat(sub) -> None:
    c = sub.add_parser("chat", help="chat with a running server in this terminal")
    add_url_arguments(c)
    c.add_argument("--name", help="your user name (default: $USER)")
    c.add_argument("--token", help="your token, when the server requires one")
    c.add_argument("--max-tokens", type=int, default=256)
    c.add_argument("--temperature", type=float, default=0.7)
    c.set_defaults(run=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    import asyncio
    import getpass

    from tui.chat import ChatClient

    name = args.name or getpass.getuser()
    client = ChatClient(server_url(args), name, args.token, args.max_tokens, args.temperature)
    return asyncio.run(client.run())
