"""`localserve demo`: the model served in-process, four people sharing it, the monitor watching.

tui (and Textual with it) is imported only when the command runs.

Tested in tests/unit/cli/test_cli.py.
"""

from __future__ import annotations

import argparse
import contextlib

from localserve.cli.shared import (
    NO_PREFIX_CACHE_HELP,
    add_model_argument,
    log_to_file,
    model_name,
    non_negative_float,
    prefix_cache_option,
    say_where,
)


def add(sub) -> None:
    d = sub.add_parser(
        "demo",
        help="server + monitor + four people sharing one model",
        description="Serve the model in this process, play four people chatting with it (one "
        "pastes a long document), and watch it all in the live monitor. q quits.",
    )
    add_model_argument(d)
    d.add_argument("--seed", type=int, default=0, help="varies the scenario's prompts and pauses")
    d.add_argument(
        "--pace",
        type=non_negative_float,
        default=1.0,
        help="scales the scenario's pauses (default %(default)s)",
    )
    d.add_argument("--screenshot", metavar="SVG", help="run headless; save the screen to SVG")
    d.add_argument(
        "--after",
        type=non_negative_float,
        default=40.0,
        help="seconds before the screenshot (default %(default)s)",
    )
    d.add_argument("--no-prefix-cache", action="store_true", help=NO_PREFIX_CACHE_HELP)
    d.set_defaults(run=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """Serve the model in-process, play the four-person scenario, show the monitor."""
    import asyncio
    import tempfile

    import msgspec

    from localserve.bench.scenario import play
    from localserve.config import config_path, load_config
    from localserve.serve.serving import serving
    from tui.monitor import MonitorApp
    from tui.source import WebSocketSource

    config = prefix_cache_option(load_config(args.config), args.no_prefix_cache)
    name = model_name(config, args.model)  # before the log goes to a file: said on stderr
    log_path = log_to_file("demo")
    # the demo's people are not real users: their usage goes to a state directory of its own
    state = tempfile.TemporaryDirectory(prefix="localserve-demo-")
    config.server = msgspec.structs.replace(config.server, state_dir=state.name)
    with state, serving(config, name, thread=True, models_file=config_path(args.config)) as served:
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
