"""The Textual monitor: Pilot tests on a fake stats source, snapshots, and one real end-to-end."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import msgspec
import pytest
from helpers import async_wait_until
from textual.widgets import Static

from tui.app import HelpScreen, MonitorApp
from tui.source import Connected, Disconnected, QueueSource
from tui.widgets import HeaderBar, KVBar, RunningTable, WaitingTable


def feed(app: MonitorApp, *items) -> None:
    for item in items:
        app.source.push(item)


def header_text(app: MonitorApp) -> str:
    return str(app.query_one(HeaderBar).render())


async def settle(pilot) -> None:
    """Wait until the app has taken every item fed to it (it handles each as it takes it), then
    for the messages that caused to be processed."""
    queue = pilot.app.source.queue
    await async_wait_until(queue.empty, 30, "the app took every item", pause=pilot.pause)
    await pilot.pause()


def test_widgets_follow_the_stats(fake_snapshots):
    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(100, 30)) as pilot:
            feed(app, Connected("ws://test"), *fake_snapshots)
            await settle(pilot)
            last = fake_snapshots[-1]
            assert app.query_one(RunningTable).row_count == len(last.seqs) == 8
            assert app.query_one(WaitingTable).row_count == len(last.waiting_seqs) == 3
            assert "● live" in header_text(app) and "fake" in header_text(app)
            kv = str(app.query_one(KVBar).render())
            live, free = last.kv_used - last.kv_cached, last.kv_total - last.kv_committed
            assert f"KV {live:,} used (█)" in kv and f"{free:,} free" in kv
            assert f"{last.kv_cached} cached (░) in 1 prefix" in kv
            assert "prefill" in str(app.query_one(RunningTable).get_row_at(1))
            assert len(app.history) == 30

    asyncio.run(run())


@pytest.mark.parametrize("width", [80, 120])
def test_kv_bar_shows_cached_prefixes_and_fits(fake_snapshots, width):
    last = fake_snapshots[-1]
    total, live = last.kv_total, last.kv_committed - last.kv_cached
    cached = msgspec.structs.replace(
        last,
        kv_used=last.kv_used - last.kv_cached + 4000,
        kv_committed=live + 4000,
        kv_cached=4000,
        cached_prefixes=5,
        counters=msgspec.structs.replace(last.counters, cached_tokens=12345, prefix_hits=17),
    )

    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(width, 30)) as pilot:
            feed(app, Connected("ws://test"), cached)
            await settle(pilot)
            bar, legend = str(app.query_one(KVBar).render()).split("\n")
            assert len(bar) <= width - 1 and len(legend) <= width - 1
            assert bar.count("░") == round((live + 4000) / total * (width - 2)) - round(
                live / total * (width - 2)
            )
            assert "4,000 cached (░) in 5 prefixes" in legend
            if width >= 120:
                assert "reused 12,345 tokens in 17 hits" in legend
            counters = str(app.query_one("#counters", Static).render())
            assert "reused 12345 tok in 17 hits" in counters

    asyncio.run(run())


def test_kv_bar_draws_a_shared_system_prompt_once(fake_snapshots):
    """Rows sharing a cached system prompt draw only their own cells; the prompt's cells come
    once after them, in the neutral colour, and the bar still adds up to the live cells."""
    last = fake_snapshots[-1]
    system = 1000
    rows = [
        msgspec.structs.replace(r, own_cells=r.cells, own_computed=r.computed_tokens)
        for r in last.seqs
    ]
    rows[0] = msgspec.structs.replace(
        rows[0], cells=system + 100, computed_tokens=system + 80, own_cells=100, own_computed=80
    )
    rows[1] = msgspec.structs.replace(
        rows[1], cells=system + 50, computed_tokens=system + 50, own_cells=50, own_computed=50
    )
    own = sum(r.own_cells for r in rows)
    shared = msgspec.structs.replace(
        last,
        seqs=rows,
        kv_total=8000,
        kv_used=own + system,
        kv_committed=own + system,
        kv_cached=0,
        kv_live=own + system,
        kv_live_used=own + system,
    )

    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(102, 30)) as pilot:
            feed(app, Connected("ws://test"), shared)
            await settle(pilot)
            bar, legend = str(app.query_one(KVBar).render()).split("\n")
            width = 100  # the bar's columns: the widget's width less a margin each side
            drawn = round((own + system) / 8000 * width)
            assert bar.count("▓") == drawn - round(own / 8000 * width) > 0
            assert len(bar.rstrip("·")) - 1 == drawn
            assert f"{own + system:,} committed (▒) · {system:,} shared (▓)" in legend

    asyncio.run(run())


def test_pause_holds_the_screen_and_resume_catches_up(fake_snapshots):
    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(100, 30)) as pilot:
            feed(app, Connected("ws://test"), *fake_snapshots[:3])
            await settle(pilot)
            rows = app.query_one(RunningTable).row_count
            await pilot.press("p")
            assert "paused" in header_text(app)
            feed(app, *fake_snapshots[3:])
            await settle(pilot)
            assert app.query_one(RunningTable).row_count == rows  # held still
            await pilot.press("p")
            await settle(pilot)
            assert app.query_one(RunningTable).row_count == len(fake_snapshots[-1].seqs)

    asyncio.run(run())


def test_help_opens_and_closes_and_q_quits():
    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test() as pilot:
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            assert not isinstance(app.screen, HelpScreen)
            await pilot.press("q")
        return app

    app = asyncio.run(run())
    assert not app.is_running


def test_disconnect_is_shown_and_reconnect_clears_it(fake_snapshots):
    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(100, 30)) as pilot:
            feed(app, Connected("ws://test"), fake_snapshots[0])
            await settle(pilot)
            feed(app, Disconnected("connection refused"))
            await settle(pilot)
            assert "disconnected (connection refused)" in header_text(app)
            assert app.screen.has_class("disconnected")
            feed(app, Connected("ws://test"), fake_snapshots[1])
            await settle(pilot)
            assert "● live" in header_text(app) and not app.screen.has_class("disconnected")

    asyncio.run(run())


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_snapshot(snap_compare, fake_snapshots, size):
    app = MonitorApp(QueueSource(), "ws://127.0.0.1:8765")

    async def run_before(pilot) -> None:
        feed(app, Connected("ws://127.0.0.1:8765"), *fake_snapshots)
        await settle(pilot)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_importing_the_server_never_loads_textual():
    code = "import localserve.server, localserve.cli, sys; assert 'textual' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.model
def test_monitor_sees_a_running_sequence_on_a_real_server(live):
    from conftest import WS

    from tui.source import WebSocketSource

    async def run():
        app = MonitorApp(WebSocketSource(live.url, interval_ms=100), live.url)
        async with app.run_test(size=(100, 30)) as pilot:
            ws = WS(live.url)
            ws.hello("watcher")
            ws.chat("seen", "Tell me a story.", max_tokens=400, ignore_eos=True)
            table = app.query_one(RunningTable)
            await async_wait_until(
                lambda: table.row_count, 30, "a row", pause=lambda: pilot.pause(0.02)
            )
            assert table.row_count == 1
            assert "watcher" in str(table.get_row_at(0)[0])
            assert "● live" in header_text(app)
            ws.send({"type": "cancel", "id": "seen"})
            ws.until_done("seen")
            ws.close()

    asyncio.run(run())
    live.wait_idle()
