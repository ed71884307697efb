"""The Textual monitor (tui/monitor.py, its widgets and formats seen through it): Pilot tests on a
fake stats source, and snapshots. Its end-to-end run on a real server is e2e/test_monitor.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import msgspec
import pytest
from textual.geometry import Region
from textual.widgets import Static

from localserve.protocol.frames import Error, Stats, UserUsage
from localserve.protocol.snapshot import Device, PrefixTier, Worker
from localserve.websocket_client import ClientError
from tests.support.monitor import header_text
from tests.support.waiting import async_wait_until
from tui import source
from tui.format import tokens
from tui.monitor import HelpScreen, MonitorApp
from tui.source import (
    NO_MONITOR_TOKEN,
    NO_MONITOR_TOKEN_HINT,
    USER_TOKEN,
    Connected,
    Disconnected,
    QueueSource,
    Refused,
    WebSocketSource,
)
from tui.widgets.cells import KVBar
from tui.widgets.header import DiagnosisLine, HeaderBar, devices_text
from tui.widgets.requests import RunningTable, WaitingTable
from tui.widgets.style import known_color
from tui.widgets.today import TodayPanel, today_table


def feed(app: MonitorApp, *items) -> None:
    for item in items:
        app.source.push(item)


# today's totals as a server's stats frames carry them: most tokens first
HINT = NO_MONITOR_TOKEN_HINT

USAGE = [
    UserUsage("eve", 8, 41230, 1200, 9800, 50000),  # 49,830 of 50,000: nearly spent
    UserUsage("cleo", 3, 18000, 0, 2300),  # no quota
    UserUsage("ana", 12, 9100, 6400, 3100, 20000),
    UserUsage("ben", 2, 1400, 0, 2520),
    UserUsage("dev", 1, 40, 0, 12, 1000),
]


def with_usage(snapshots, usage=USAGE) -> list[Stats]:
    return [Stats(snap, list(usage)) for snap in snapshots]


def today_lines(app: MonitorApp) -> list[str]:
    return str(app.query_one(TodayPanel).render()).split("\n")


def shown(app: MonitorApp, selector: str) -> bool:
    return app.query_one(selector).display


def footer_keys(app: MonitorApp) -> set[str]:
    """The keys the footer shows now."""
    return {b.key for _, b, enabled, _ in app.screen.active_bindings.values() if b.show and enabled}


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


MIB, GIB = 1 << 20, 1 << 30


def with_tiers(snap, disk_problem: str = ""):
    """The snapshot with a host tier, and a disk tier that is on or off for `disk_problem`."""
    host = PrefixTier(True, "", 12, 340 * MIB, 4096 * MIB, hits=5, restored_tokens=7100)
    disk = PrefixTier(not disk_problem, disk_problem, 30, 1.2 * GIB, 16 * GIB, hits=2,
                      restored_tokens=1420)  # fmt: skip
    return msgspec.structs.replace(snap, host_tier=host, disk_tier=disk)


@pytest.mark.parametrize("width", [80, 120])
def test_the_kv_panel_shows_the_prefix_cache_tiers(fake_snapshots, width):
    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(width, 30)) as pilot:
            feed(app, Connected("ws://test"), with_tiers(fake_snapshots[-1]))
            await settle(pilot)
            kv = app.query_one(KVBar)
            _, _, tiers = str(kv.render()).split("\n")
            assert kv.size.height == 3 and len(tiers) <= width - 1
            assert tiers.startswith(" host 340/4,096 MiB, 12 saved, 5 hits")
            assert "disk 1.2/16.0 GiB, 30 saved, 2 hits" in tiers
            assert ("restored 8,520 tokens" in tiers) == (width >= 120)
            feed(app, with_tiers(fake_snapshots[-1], "no room on /var (2.0 GiB free)"))
            await settle(pilot)
            tiers = str(kv.render()).split("\n")[2]
            assert " · disk off: no room on /var" in tiers
            feed(app, fake_snapshots[-1])  # no tiers: two lines again
            await settle(pilot)
            assert len(str(kv.render()).split("\n")) == 2 and kv.size.height == 2

    asyncio.run(run())


def test_a_restored_request_is_shown_apart_from_a_prefill(fake_snapshots):
    last = fake_snapshots[-1]
    rows = list(last.seqs)
    i = next(k for k, r in enumerate(rows) if r.phase == "prefill")
    rows[i] = msgspec.structs.replace(
        rows[i], prompt_tokens=1500, computed_tokens=1420, restored_tokens=1420,
        restored_from="disk", cached_tokens=1420,
    )  # fmt: skip
    j = next(k for k, r in enumerate(rows) if r.phase == "decode")
    rows[j] = msgspec.structs.replace(rows[j], restored_tokens=300, restored_from="host")

    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(160, 30)) as pilot:
            feed(app, Connected("ws://test"), msgspec.structs.replace(last, seqs=rows))
            await settle(pilot)
            table = app.query_one(RunningTable)
            restored = [str(c) for c in table.get_row_at(i)]
            assert restored[2] == "restored 1.4k · 95%" and restored[-1] == "1420 disk"
            decoding = [str(c) for c in table.get_row_at(j)]
            assert decoding[2].startswith("decode") and decoding[-1] == "300 host"

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


def test_a_refused_token_is_named_with_when_the_monitor_tries_again(fake_snapshots):
    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(100, 30)) as pilot:
            feed(app, Refused(NO_MONITOR_TOKEN, 5.0, HINT))
            await settle(pilot)
            what, how = header_text(app).splitlines()  # the state, and below it the hint
            assert what == f"● {NO_MONITOR_TOKEN}; trying again in 5 s"
            assert how.strip() == HINT and "reconnecting" not in what
            header = app.query_one(HeaderBar)
            shown = header.render_lines(Region(0, 0, 100, header.size.height))
            assert " ".join(line.text.strip() for line in shown[1:]) == HINT  # all of it, wrapped
            assert app.screen.has_class("disconnected")
            feed(app, Connected("ws://test"), fake_snapshots[0])
            await settle(pilot)
            assert "● live" in header_text(app)

    asyncio.run(run())


class RefusingClient:
    """A server that takes the connection and refuses the monitor token, every time."""

    def __init__(self) -> None:
        self.frames = [Error("unauthorized", "stats need the server's monitor token")]

    async def send(self, frame) -> None:
        pass

    async def recv(self):
        return self.frames.pop(0)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        pass


def source_items(monkeypatch, connect, count: int) -> tuple[list, list[float]]:
    """The first `count` items of a WebSocketSource on `connect`, and the waits it took."""
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(source.Client, "connect", staticmethod(connect))
    monkeypatch.setattr(source, "asyncio", type("Asyncio", (), {"sleep": staticmethod(sleep)}))

    async def run():
        items = []
        async for item in WebSocketSource("ws://test"):
            items.append(item)
            if len(items) == count:
                return items

    return asyncio.run(run()), waits


def test_a_refused_monitor_token_is_tried_again_ever_more_slowly(monkeypatch):
    """Not once a second into the server's throttle: 5 s, doubling, at most a minute."""

    async def connect(url, user, token):
        return RefusingClient()

    items, waits = source_items(monkeypatch, connect, 7)
    assert items == [Refused(NO_MONITOR_TOKEN, s, HINT) for s in (5, 10, 20, 40, 60, 60, 60)]
    assert waits == [5, 10, 20, 40, 60, 60]


def test_a_refused_hello_names_the_user_token_and_stats_reset_the_wait(monkeypatch, fake_snapshots):
    calls = []

    async def connect(url, user, token):
        calls.append(url)
        if len(calls) <= 2:
            raise ClientError("unauthorized", "unknown user or wrong token")
        client = RefusingClient()
        if len(calls) == 3:  # the token is right now: stats, then a refusal again
            client.frames.insert(0, Stats(fake_snapshots[0], USAGE))
        return client

    items, waits = source_items(monkeypatch, connect, 6)
    assert items[:2] == [Refused(USER_TOKEN, 5), Refused(USER_TOKEN, 10)]
    assert items[2] == Connected("ws://test") and isinstance(items[3], Stats)
    assert items[4:] == [Refused(NO_MONITOR_TOKEN, 5, HINT), Refused(NO_MONITOR_TOKEN, 10, HINT)]
    assert waits == [5, 10, 5]


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


# the embedded model split over the local CPU and two workers (as unit/runners/test_placement.py
# reads it from a real load)
SPLIT = (
    Device("CPU", "AMD EPYC", 7, 14.0),
    Device("RPC0", "127.0.0.1:50081", 6, 12.0, "127.0.0.1:50081"),
    Device("RPC1", "127.0.0.1:50082", 5, 10.0, "127.0.0.1:50082"),
)
GONE = "RPC worker 127.0.0.1:50082 not answering; restarting the engine"


def split(snap, problem: str = "", down: str = ""):
    """`snap` with the model split over SPLIT, the engine's problem, and the worker at `down`
    found down."""
    workers = [Worker(d.endpoint, d.endpoint != down, "") for d in SPLIT if d.endpoint]
    model = msgspec.structs.replace(snap.model, devices=SPLIT)
    return msgspec.structs.replace(snap, model=model, engine_problem=problem, workers=workers)


@pytest.mark.parametrize("width", [80, 120])
def test_the_header_lists_a_split_models_devices_and_the_engines_problem(fake_snapshots, width):
    last = fake_snapshots[-1]

    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(width, 30)) as pilot:
            feed(app, Connected("ws://test"), *fake_snapshots)
            await settle(pilot)
            assert app.query_one(HeaderBar).size.height == 1  # no devices, no second line
            feed(app, split(last))
            await settle(pilot)
            header = app.query_one(HeaderBar)
            assert header.size.height == 2
            first, second = header_text(app).split("\n")
            assert first.startswith("● live fake · 8 slots") and " CPU " not in first
            if width >= 120:
                assert second == (
                    "  CPU 7L, KV 14 MiB · RPC0 127.0.0.1:50081 6L, KV 12 MiB · "
                    "RPC1 127.0.0.1:50082 5L, KV 10 MiB"
                )
            else:
                assert second == "  CPU 7L · RPC0 127.0.0.1:50081 6L · RPC1 127.0.0.1:50082 5L"
            diagnosis = app.query_one(DiagnosisLine)
            assert "engine down" not in str(diagnosis.render())

            feed(app, split(last, GONE, down="127.0.0.1:50082"))
            await settle(pilot)
            first, second = header_text(app).split("\n")
            assert len(first) <= width and len(second) <= width
            assert first.startswith(f"● engine down: {GONE[: width - 30]}")
            assert "RPC1 127.0.0.1:50082 5L" in second and second.endswith(" down")
            line = header.render()
            assert any(span.style == "bold red" for span in line.spans)  # the state, in red
            assert diagnosis.has_class("level-bad")
            headline = str(diagnosis.render()).strip()
            assert headline.startswith("engine down: RPC worker 127.0.0.1:50082")

            feed(app, split(last))  # back
            await settle(pilot)
            assert header_text(app).startswith("● live")
            assert not diagnosis.has_class("level-bad")

    asyncio.run(run())


def test_the_header_says_when_the_usage_record_cannot_be_written(fake_snapshots):
    """The stats frame carries the record's problem; the header shows it in red, then "live"
    again once a frame without it comes."""
    problem = "cannot write /var/lib/localserve/usage.sqlite3: database or disk is full"
    last = fake_snapshots[-1]

    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(120, 30)) as pilot:
            feed(app, Connected("ws://test"), Stats(last, usage_problem=problem))
            await settle(pilot)
            first = header_text(app)
            assert first.startswith("● usage not recorded: cannot write /var/lib/localserve")
            assert len(first) <= 120 and "fake" in first
            assert any(span.style == "bold red" for span in app.query_one(HeaderBar).render().spans)
            feed(app, Stats(last))
            await settle(pilot)
            assert header_text(app).startswith("● live")

    asyncio.run(run())


def test_the_devices_line_says_less_before_it_leaves_devices_out():
    many = SPLIT + tuple(
        Device(f"RPC{i}", f"10.0.0.{i}:50052", 1, 1.0, f"10.0.0.{i}:50052") for i in range(2, 9)
    )
    workers = [Worker("10.0.0.9:50052", False, "connection refused")]
    line = devices_text(many, workers, 80).plain
    assert len(line) <= 80 and line.startswith("  CPU 7L · RPC0 6L · RPC1 5L · RPC2 1L")
    assert line.endswith(" more")  # the down worker is among those left out
    assert devices_text(many, workers, 400).plain.endswith("worker 10.0.0.9:50052 down")
    assert devices_text((), workers, 80).plain == "  worker 10.0.0.9:50052 down"


def test_today_panel_shows_each_users_totals_beside_the_events(fake_snapshots):
    """A tall screen has room for both: today's totals under the counters, the event log
    beside them; the column names sit in the panel's title, each above its column."""

    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(120, 40)) as pilot:
            feed(app, Connected("ws://test"), *with_usage(fake_snapshots))
            await settle(pilot)
            panel = app.query_one(TodayPanel)
            assert shown(app, "#today") and shown(app, "#events")
            assert panel.border_title == "today  req     in  cached   out  quota"
            assert not panel.border_subtitle  # every user fits
            assert today_lines(app) == [
                "eve       8  41.2k      3%  9.8k  49.8k/50k",
                "cleo      3    18k      0%  2.3k  —",
                "ana      12   9.1k     70%  3.1k  5.8k/20k",
                "ben       2   1.4k      0%  2.5k  —",
                "dev       1     40      0%    12  52/1k",
            ]
            assert "t" not in footer_keys(app)  # nothing to switch: both are shown
            await pilot.press("t")
            assert shown(app, "#today") and shown(app, "#events")
            # names are in their users' colours, but only users the live views have shown
            # take one: a day's users must not use up the distinct colours
            feed(app, *with_usage(fake_snapshots[-1:], [*USAGE, UserUsage("zed", 1, 5, 0, 5)]))
            await settle(pilot)
            assert known_color("eve") and not known_color("zed")

    asyncio.run(run())


def test_today_panel_takes_the_event_logs_place_on_a_short_screen(fake_snapshots):
    """At 80x24 only the top users fit, the rest counted in the subtitle; t brings the event
    log back (it kept logging meanwhile) and t again today's totals."""

    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(80, 24)) as pilot:
            feed(app, Connected("ws://test"), *with_usage(fake_snapshots))
            await settle(pilot)
            panel = app.query_one(TodayPanel)
            assert shown(app, "#today") and not shown(app, "#events")
            assert panel.border_subtitle == "+2 more"
            lines = today_lines(app)
            assert [line.split()[0] for line in lines] == ["eve", "cleo", "ana"]
            assert lines[0].split() == ["eve", "8", "41.2k", "3%", "9.8k", "49.8k/50k"]
            assert panel.border_title.split() == ["today", "req", "in", "cached", "out", "quota"]
            assert "t" in footer_keys(app)
            await pilot.press("t")
            assert not shown(app, "#today") and shown(app, "#events")
            assert app.query_one("#events").lines  # the events that came meanwhile
            await pilot.press("t")
            assert shown(app, "#today") and not shown(app, "#events")

    asyncio.run(run())


def test_no_usage_today_shows_no_panel(fake_snapshots):
    """Before anyone has used the server today (or from a server that keeps no usage) the panel
    stays hidden and t does nothing; a bare snapshot leaves the totals it had."""

    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(80, 24)) as pilot:
            feed(app, Connected("ws://test"), *with_usage(fake_snapshots[:3], []))
            await settle(pilot)
            assert not shown(app, "#today") and shown(app, "#events")
            assert "t" not in footer_keys(app)
            await pilot.press("t")
            assert not shown(app, "#today") and shown(app, "#events")
            await pilot.press("t")  # back as it was
            feed(app, *with_usage(fake_snapshots[3:5]), fake_snapshots[5])
            await settle(pilot)
            assert shown(app, "#today") and today_lines(app)[0].startswith("eve")
            feed(app, *with_usage(fake_snapshots[6:8], []))  # a new day
            await settle(pilot)
            assert not shown(app, "#today") and shown(app, "#events")

    asyncio.run(run())


def test_pause_holds_todays_totals_too(fake_snapshots):
    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(120, 40)) as pilot:
            feed(app, Connected("ws://test"), *with_usage(fake_snapshots[:3], USAGE[:1]))
            await settle(pilot)
            await pilot.press("p")
            feed(app, *with_usage(fake_snapshots[3:]))
            await settle(pilot)
            assert len(today_lines(app)) == 1
            await pilot.press("p")
            await settle(pilot)
            assert len(today_lines(app)) == len(USAGE)

    asyncio.run(run())


def test_today_table_drops_columns_that_do_not_fit_and_keeps_heads_over_them():
    usage = [
        UserUsage("eve", 8, 41230, 1200, 9800, 50000),
        UserUsage("a-very-long-name", 1234, 1_234_567, 1_000_000, 99_999, None),
    ]
    wide = today_table(usage, 60, 5)
    assert wide.columns == ("req", "in", "cached", "out", "quota")
    assert wide.text.plain.split("\n") == [  # room for the whole name: it is shown whole
        "eve                   8  41.2k      3%  9.8k  49.8k/50k",
        "a-very-long-name  1,234   1.2M     81%  100k  —",
    ]
    # each head ends where its column does (quota's starts where it does), one column left of
    # the text: the panel draws its title from one column further right
    assert wide.title == "today              req     in  cached   out  quota"
    assert today_table(usage, 46, 5).text.plain.split("\n")[1].startswith("a-very-long… ")
    assert today_table(usage, 46, 5).columns == ("req", "in", "cached", "out", "quota")
    assert today_table(usage, 38, 5).columns == ("req", "in", "out", "quota")
    assert today_table(usage, 32, 5).columns == ("in", "out", "quota")
    assert today_table(usage, 26, 5).columns == ("in", "quota")
    # the title counts too: a panel's border leaves it less room than the text
    assert today_table(usage, 46, 5, title_width=38).columns == ("req", "in", "out", "quota")
    one = today_table(usage, 60, 1)
    assert one.text.plain.startswith("eve") and "\n" not in one.text.plain
    assert one.more == "+1 more"


def test_quota_turns_yellow_near_the_end_and_red_once_spent():
    def quota_style(used: int, quota: int) -> str:
        text = today_table([UserUsage("u", 1, used, 0, 0, quota)], 60, 1).text
        at = text.plain.index("/") - len(tokens(used))  # where the used/quota cell starts
        return next((str(span.style) for span in text.spans if span.start == at), "")

    assert quota_style(7_000, 10_000) == ""  # no span, or an unstyled one
    assert quota_style(8_000, 10_000) == "yellow"
    assert quota_style(10_000, 10_000) == "bold red"
    assert quota_style(12_000, 10_000) == "bold red"
    assert today_table([UserUsage("u", 1, 5, 0, 0, None)], 60, 1).columns[-1] == "out"


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0"), (950, "950"), (9_800, "9.8k"), (12_345, "12.3k"), (50_000, "50k"),
     (99_960, "100k"), (123_456, "123k"), (999_600, "1M"), (1_234_567, "1.2M"), (None, "—")],
)  # fmt: skip
def test_token_counts_fit_five_columns(n, text):
    assert tokens(n) == text


def test_the_websocket_source_passes_stats_frames_on_whole(fake_snapshots):
    """Today's totals come with the snapshot: the source must not keep only the snapshot."""
    frame = Stats(fake_snapshots[0], USAGE)

    class Client:
        async def recv(self):
            return frame

    async def run():
        frames = WebSocketSource("ws://test")._frames(Client())
        return await anext(frames)

    assert asyncio.run(run()) == frame


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_snapshot_with_usage_today(snap_compare, fake_snapshots, size):
    app = MonitorApp(QueueSource(), "ws://127.0.0.1:8765")

    async def run_before(pilot) -> None:
        feed(app, Connected("ws://127.0.0.1:8765"), *with_usage(fake_snapshots))
        await settle(pilot)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_importing_the_server_never_loads_textual():
    code = (
        "import localserve.serve.server, localserve.cli, sys; "
        "assert 'textual' not in sys.modules and 'tui' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_at_80x24_the_running_table_shows_the_itl_column_whole(fake_snapshots):
    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(80, 24)) as pilot:
            feed(app, Connected("ws://test"), *fake_snapshots)
            await settle(pilot)
            table = app.query_one(RunningTable)
            assert table.show_vertical_scrollbar  # 8 rows in 4: the bar takes its column too
            heads = [str(c.label) for c in table.ordered_columns]
            upto = heads.index("ITL") + 1
            right = sum(c.get_render_width(table) for c in table.ordered_columns[:upto])
            assert right <= table.scrollable_content_region.width, heads[:upto]

    asyncio.run(run())


@pytest.mark.parametrize("width, usage", [(80, False), (80, True), (100, False), (120, True)])
def test_the_counters_break_only_between_phrases(fake_snapshots, width, usage):
    from tui.widgets.counters import CountersPanel, counter_phrases

    big = msgspec.structs.replace(  # wider numbers than the fake's
        fake_snapshots[-1],
        counters=msgspec.structs.replace(
            fake_snapshots[-1].counters, finished=12345, cached_tokens=987654, prefix_hits=4321
        ),
    )

    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(width, 24)) as pilot:
            feed(app, Connected("ws://test"), *(with_usage([big]) if usage else [big]))
            await settle(pilot)
            panel = app.query_one(CountersPanel)
            lines = str(panel.render()).split("\n")
            assert len(lines) > 1 and all(len(line) <= panel.content_size.width for line in lines)
            said = [p for line in lines for p in line.removesuffix(" ·").split(" · ")]
            assert said == counter_phrases(big)  # every phrase whole, in order
            assert all(line.endswith(" ·") for line in lines[:-1])
            assert panel.size.height >= len(lines)  # all of them shown
            assert panel.region.bottom <= app.query_one("#bottom").region.bottom
            running, waiting = app.query_one(RunningTable), app.query_one(WaitingTable)
            assert (running.border_title, waiting.border_title) == ("running 8", "waiting 3")

    asyncio.run(run())


def test_at_120x40_the_event_log_has_no_scrollbar_over_its_lines_until_it_needs_one(
    fake_snapshots,
):
    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(120, 40)) as pilot:
            feed(app, Connected("ws://test"), *fake_snapshots)
            await settle(pilot)
            log = app.query_one("#events")
            assert log.virtual_size.height < log.scrollable_content_region.height
            assert not log.show_vertical_scrollbar
            width = log.scrollable_content_region.width
            assert log.virtual_size.width <= width  # each line whole
            for i in range(30):  # more than it holds: a bar of one column, beside the lines
                log.write(f"{i:6.1f}s someone admitted x-{i}: 20 prompt tokens")
            await pilot.pause()
            assert log.show_vertical_scrollbar and log.styles.scrollbar_size_vertical == 1
            assert log.scrollable_content_region.width == width - 1

    asyncio.run(run())


def test_a_throttled_hello_says_the_servers_words_and_waits_as_long_as_it_asks(monkeypatch):
    """The throttle's refusal is not a wrong token: its message, and its retry_after_s."""

    async def connect(url, user, token):
        raise ClientError("unauthorized", "too many failed attempts; try again in 30 s", 30.0)

    items, waits = source_items(monkeypatch, connect, 2)
    assert items == [Refused("too many failed attempts; try again in 30 s", 30.0)] * 2
    assert waits == [30.0]


PEOPLE = {
    "ana": "openwebui/alice",
    "ben": "openwebui/alice smith",
    "eve": "openwebui/evangeline smith-jones",
}


def behind_a_frontend(snap):
    """The snapshot with three of its users people of a trusted front-end (trusted_proxies.py)."""

    def renamed(row):
        return msgspec.structs.replace(row, user=PEOPLE.get(row.user, row.user))

    seqs = [renamed(s) for s in snap.seqs]
    return msgspec.structs.replace(
        snap, seqs=seqs, waiting_seqs=[renamed(w) for w in snap.waiting_seqs]
    )


def test_a_frontends_people_are_rows_of_their_own_by_name(fake_snapshots):
    """A front-end's person keeps the person's part of the name: the front-end's is shortened
    first ("openw…/alice"), then left as "…/"; at 120 columns "openwebui/alice smith" shows
    whole in the running table and the person's part whole in today's; at 80 columns the
    running table still shows up to ITL."""
    snapshots = [behind_a_frontend(s) for s in fake_snapshots]
    usage = [UserUsage(PEOPLE.get(u.user, u.user), *msgspec.structs.astuple(u)[1:]) for u in USAGE]

    async def seen(size):
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=size) as pilot:
            feed(app, Connected("ws://test"), *with_usage(snapshots, usage))
            await settle(pilot)
            table = app.query_one(RunningTable)
            users = {str(table.get_row_at(i)[0]) for i in range(table.row_count)}
            waiting = app.query_one(WaitingTable)
            queued = {str(waiting.get_row_at(i)[0]) for i in range(waiting.row_count)}
            heads = [str(c.label) for c in table.ordered_columns]
            upto = heads.index("ITL") + 1
            right = sum(c.get_render_width(table) for c in table.ordered_columns[:upto])
            assert right <= table.scrollable_content_region.width, heads[:upto]
            return users, queued, today_lines(app)

    async def run():
        users, queued, today = await seen((80, 24))
        assert {"openw…/alice", "…/alice smi…", "…/evangelin…"} <= users  # 12 of a name
        assert queued <= users
        assert today[0].startswith("…/evangel… ")  # 10 of a name
        assert any(line.startswith("ope…/alice ") for line in today), today
        users, queued, today = await seen((120, 40))
        assert {"openwebui/alice", "openwebui/alice smith", "…/evangeline smith-jon…"} <= users
        assert queued == {"…/evangelin…"}  # the queue's narrower column (it says when each enters)
        assert any(line.startswith("openwebui/alice smith ") for line in today), today
        assert any(line.startswith("openwebui/alice ") for line in today), today

    asyncio.run(run())


def test_the_header_lists_several_models_with_their_states(fake_snapshots):
    from localserve.protocol.frames import ModelStatus
    from tui.widgets.header import header_text as header

    models = [
        ModelStatus("gemma", "loaded", busy=True),
        ModelStatus("small", "loading", waiting=2),
        ModelStatus("coder", "loaded"),
        ModelStatus("big", "failed", reason="too big"),
    ]
    snap = fake_snapshots[-1]
    text = str(header(snap, True, "live", "", 300, models))
    assert "models: gemma busy, small loading (2 waiting), coder idle, big failed" in text
    assert "models:" not in str(header(snap, True, "live", "", 300, models[:1]))
    # the engine the panels show is named, and the models' states outrank the settings: kept
    # at 120 and 80 columns (cut to fit there), the settings left out first
    assert f"panels: {snap.model.model}" in text
    for width in (120, 80):
        line = str(header(snap, True, "live", "", width, models)).splitlines()[0]
        assert len(line) <= width and f"panels: {snap.model.model} · models: gemma busy" in line
    assert "big failed" in str(header(snap, True, "live", "", 120, models))
    assert "panels:" not in str(header(snap, True, "live", "", 120, models[:1]))  # one model


def test_the_step_line_says_what_the_drafts_gave():
    from localserve.config import SchedulerConfig
    from localserve.runners.fake import FakeRunner
    from tests.support.harness import Harness
    from tui.widgets.speed import batch_text

    def line(speculative: str) -> str:
        h = Harness(
            FakeRunner(max_draft_rows=32, repeats=1000), SchedulerConfig(speculative=speculative)
        )
        h.add("a", 60, max_tokens=200)
        for _ in range(30):
            h.step()
        return str(batch_text(h.engine.snapshot().result()))

    on = line("ngram")
    assert "\ndraft " in on and "% kept: " in on and " tok per decode" in on
    assert "draft" not in line("off")


def test_embedding_requests_are_rows_of_their_own_kind(fake_snapshots):
    from localserve.protocol.snapshot import EmbeddingRow

    rows = [
        EmbeddingRow("e1", "emb-1", "ivy", "running", 64, 12, 700, 130, 3.0),
        EmbeddingRow("e2", "emb-2", "joe", "waiting", 2, 0, 20, 0, 1.5),
    ]
    last = msgspec.structs.replace(
        fake_snapshots[-1], embeddings=rows, embed_tokens_per_s=55.0, embed_inputs_per_s=4.5
    )

    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(120, 40)) as pilot:
            feed(app, Connected("ws://test"), *fake_snapshots[:-1], last)
            await settle(pilot)
            running, waiting = app.query_one(RunningTable), app.query_one(WaitingTable)
            assert running.row_count == len(last.seqs) + 1
            assert waiting.row_count == len(last.waiting_seqs) + 1
            row = [str(c) for c in running.get_row_at(running.row_count - 1)]
            assert row[:3] == ["ivy", "emb-1", "embed 12/64"] and row[6] == "700"
            queued = [str(c) for c in waiting.get_row_at(waiting.row_count - 1)]
            assert queued[0] == "joe" and queued[-1] == "emb-2 (embed, 2 inputs)"
            assert "embed 55 tok/s, 4.5 inputs/s" in str(app.query_one("#batch").render())

    asyncio.run(run())


def several_models(snapshots, shown: str) -> list[Stats]:
    """Stats frames of a server with two models, their snapshots `shown`'s engine's."""
    from localserve.protocol.frames import ModelStatus

    models = [ModelStatus("gemma", "loaded"), ModelStatus("small", "loaded", busy=True)]
    return [
        Stats(msgspec.structs.replace(s, model=msgspec.structs.replace(s.model, model=shown)),
              models=models)
        for s in snapshots
    ]  # fmt: skip


def test_m_switches_the_panels_to_the_next_models_engine_and_its_figures_start_afresh(
    fake_snapshots,
):
    async def run():
        app = MonitorApp(QueueSource(), "ws://test")
        async with app.run_test(size=(120, 40)) as pilot:
            feed(app, Connected("ws://test"), fake_snapshots[0])  # one model: no switch
            await settle(pilot)
            assert "m" not in footer_keys(app)
            await pilot.press("m")
            assert app.source.model is None
            feed(app, *several_models(fake_snapshots[:20], "gemma"))
            await settle(pilot)
            assert "m" in footer_keys(app) and len(app.history) == 20  # the fake model's: gone
            await pilot.press("m")
            await pilot.pause()
            assert app.source.model == app.watching == "small"  # the source subscribes to it
            assert "panels: gemma (small not loaded)" in header_text(app)  # until its frames
            feed(app, *several_models(fake_snapshots[20:], "small"))
            await settle(pilot)
            assert "panels: small · models: gemma idle, small busy" in header_text(app)
            assert len(app.history) == 10  # gemma's figures are not small's
            assert "the panels show small now" in "\n".join(
                str(line.text) for line in app.query_one("#events").lines
            )
            await pilot.press("m")  # after the last, the first
            await pilot.pause()
            assert app.source.model == "gemma"

    asyncio.run(run())


def test_snapshot_of_the_second_model(snap_compare, fake_snapshots):
    """At 120 columns with two models: the second model's engine, its requests running."""
    app = MonitorApp(QueueSource(), "ws://127.0.0.1:8765")

    async def run_before(pilot) -> None:
        feed(app, Connected("ws://127.0.0.1:8765"), *several_models(fake_snapshots, "small"))
        await settle(pilot)

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)


def test_a_name_that_mixes_scripts_is_marked():
    """ "dаve" with a Cyrillic а reads as dave: the monitor marks it (≈), in the width it has;
    names of one script (accents, Greek, Japanese kana with kanji) are not marked."""
    from tui.format import MIXED_MARK, mixes_scripts, user_label

    assert mixes_scripts("d\u0430ve") and mixes_scripts("openwebui/d\u0430ve")
    for plain in ("dave", "jürgen müller", "σοφία", "やまだ 山田", "openwebui/alice", "u7"):
        assert not mixes_scripts(plain), plain
    assert user_label("openwebui/d\u0430ve", 12) == MIXED_MARK + "openw…/d\u0430ve"
    assert len(user_label("openwebui/d\u0430ve smith", 12)) == 12
    assert user_label("dave", 12) == "dave"
