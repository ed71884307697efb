"""Reading the Textual monitor's screen (tui/monitor.py) in tests."""

from __future__ import annotations

import asyncio

from localserve.cli import build_parser
from localserve.cli.monitor import build_monitor
from tests.support.waiting import async_wait_until
from tui.monitor import MonitorApp
from tui.widgets.header import HeaderBar


def header_text(app: MonitorApp) -> str:
    return str(app.query_one(HeaderBar).render())


def monitor_header(url: str, *argv: str, model: str = "gemma") -> tuple[str, str]:
    """`localserve monitor URL ARGV` built as the command builds it, run under Textual's pilot
    until its header says how the connection went (live: with the model's name): the header's
    text and the whole screen's."""
    app = build_monitor(build_parser().parse_args(["monitor", url, *argv]))

    async def run() -> tuple[str, str]:
        async with app.run_test(size=(120, 40)) as pilot:
            await async_wait_until(
                lambda: "● live" in header_text(app) or "trying again" in header_text(app),
                60,
                "stats or a refusal",
                pause=lambda: pilot.pause(0.05),
            )
            if "● live" in header_text(app):  # and the numbers with it: the model's name
                await async_wait_until(
                    lambda: model in header_text(app), 30, "a snapshot", lambda: pilot.pause(0.05)
                )
            return header_text(app), app.export_screenshot()

    return asyncio.run(run())
