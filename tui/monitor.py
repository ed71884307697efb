"""`localserve monitor`: what the scheduler is doing, live, and why the server feels slow.

The app consumes a stats source (the server's `stats` frames, reconnecting) in a worker, keeps
a couple of minutes of snapshots for sparklines and the diagnosis, and renders the newest one with
today's per-user totals that came with it (a `today` panel, shown once anyone has used the server
today). Keys: q quits, p pauses (the stream keeps coming, the screen holds still), t switches
between today's totals and the event log where there is room for only one, m (with several
models) shows the next model's engine, ? shows help. Which model's engine the panels show is
always on the header's first line ("panels: NAME"); a switch starts its figures afresh.
"""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, RichLog, Static

from localserve.protocol.frames import ModelStatus, Stats, UserUsage
from localserve.protocol.snapshot import Snapshot
from tui.diagnosis import diagnose
from tui.source import Connected, Disconnected, Refused
from tui.widgets.cells import KVBar
from tui.widgets.counters import CountersPanel
from tui.widgets.header import DiagnosisLine, HeaderBar
from tui.widgets.requests import RunningTable, WaitingTable
from tui.widgets.speed import LatencyPanel, ThroughputPanel
from tui.widgets.style import reset_colors, user_color
from tui.widgets.today import TodayPanel

HISTORY_LENGTH = 240  # snapshots kept: two minutes at the default 0.5 s interval

HELP = """\
[b]localserve monitor[/b]   [b]q[/b] quit  [b]p[/b] pause / resume  [b]t[/b] today / events
[b]m[/b] next model (several models)  [b]?[/b] this help (any key closes it)
[b]KV cells[/b]: each sequence in its user's colour: █ its tokens, ▒
promised to its prompt still being prefilled; then ▓ system prompts
that running sequences share (held once), ░ cached prefixes (finished
turns, system prompts) kept for reuse and evicted when cells are
needed, · free.
"reused … in N hits": prompt tokens taken from cached prefixes instead
of computed; the running table's last column has them per request.
[b]Latency[/b]: p50 p90 p99 over the last minute; sparklines show p90 over
the last minutes. TTFT = arrival → first token; ITL = gap between
tokens; queue = time before admission.
[b]step[/b]: what one engine step carries on average — decode tokens (green)
and prefill tokens (yellow), e.g. "14+96 tok" — and how long it takes.
[b]Diagnosis[/b]: the top line reads the numbers the way an operator would:
capacity bound, slot bound, prefill bound, ITL rising, idle, healthy
(the reasoning and its thresholds: docs/diagnosis.md).
[b]≈[/b] before a name: its letters mix scripts (it may look like another's).
[b]Today[/b]: each user's requests since midnight, prompt tokens in and the
share cached, tokens out, and used/quota (in − cached + out). Under 40
rows the panel takes the events' place; t switches between the two.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        yield Static(HELP.rstrip("\n"), id="help")  # no blank last line: 24 rows hold it

    def on_key(self) -> None:
        self.dismiss()


class MonitorApp(App):
    """The live monitor over any stats source."""

    CSS_PATH = "monitor.tcss"
    TITLE = "localserve monitor"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("p", "pause", "Pause"),
        Binding("t", "toggle_today", "Today/events"),
        Binding("m", "next_model", "Next model"),
        Binding("question_mark", "help", "Help"),
    ]

    def __init__(self, source, url: str = "") -> None:
        super().__init__()
        reset_colors()
        self.source = source
        self.url = url
        self.history: deque[Snapshot] = deque(maxlen=HISTORY_LENGTH)
        self.snapshot: Snapshot | None = None
        self.usage_today: list[UserUsage] = []  # as the newest stats frame had it
        self.usage_problem = ""  # why the usage record cannot be written, as it had it
        self.models: list[ModelStatus] = []  # every model and its state (several models)
        self.watching: str | None = getattr(source, "model", None)  # asked for (None: default)
        self.show_events = False  # where only one fits: the event log instead of today's totals
        self._placed: tuple[bool, bool] | None = None  # today shown, events shown with it
        self.connected = False
        self.status = f"connecting to {url}" if url else "waiting for stats"
        self.paused = False
        self._last_event_t = -1.0

    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        yield DiagnosisLine("", id="diagnosis")
        yield KVBar(id="kv")
        with Horizontal(id="middle"):
            yield LatencyPanel(id="latency")
            yield ThroughputPanel(id="throughput")
        with Horizontal(id="tables"):
            yield RunningTable(id="running")
            yield WaitingTable(id="waiting")
        with Horizontal(id="bottom"):
            with Vertical(id="left"):
                yield CountersPanel(id="counters")
            yield RichLog(id="events", max_lines=200, markup=False, wrap=False)
            yield TodayPanel(id="today")  # beside the counters, or instead of the events
        yield Footer()

    def on_mount(self) -> None:
        self._main = self.screen
        self._main.set_class(self.tall, "tall")
        self.query_one(RunningTable).border_title = "running"
        self.query_one(WaitingTable).border_title = "waiting"
        self.query_one("#latency").border_title = "latency  p50     p90     p99"
        self.query_one("#throughput").border_title = "throughput"
        self.query_one("#events").border_title = "events"
        self._place_today()
        self._render_header()
        self.run_worker(self._consume(), exclusive=True, name="stats")

    async def _consume(self) -> None:
        async for item in self.source:
            self.receive(item)

    def receive(self, item) -> None:
        """One item from the source: a snapshot, or news about the connection."""
        if isinstance(item, Connected):
            self.connected, self.status = True, "live"
            self._main.set_class(False, "disconnected")
        elif isinstance(item, Refused):  # a token to fix: said as it is
            self.connected = False
            self.status = f"{item.reason}; trying again in {item.retry_s:g} s"
            if item.hint:  # how to get the right token: the header's second line
                self.status += f"\n{item.hint}"
            self._main.set_class(True, "disconnected")
        elif isinstance(item, Disconnected):
            self.connected, self.status = False, f"disconnected ({item.reason}), reconnecting"
            self._main.set_class(True, "disconnected")
        elif isinstance(item, Stats | Snapshot):
            if isinstance(item, Stats):  # a bare snapshot leaves the totals as they were
                self.usage_today, self.usage_problem = item.usage_today, item.usage_problem
                if (len(item.models) > 1) != (len(self.models) > 1):
                    self.refresh_bindings()  # m shows in the footer only with several models
                self.models = item.models
                item = item.snapshot
            if self.snapshot is not None and item.model.model != self.snapshot.model.model:
                self._switched(item.model.model)
            self.connected = True
            self.history.append(item)
            self.snapshot = item
            if not self.paused:
                self.refresh_snapshot()
            return
        self._render_header()

    def refresh_snapshot(self) -> None:
        snap = self.snapshot
        if snap is None:
            return
        self._render_header()
        d = diagnose(list(self.history), self.models)
        self.query_one(DiagnosisLine).show(d.level, d.headline)
        self.query_one(KVBar).show(snap)
        self.query_one(LatencyPanel).show(snap, self.history)
        self.query_one(ThroughputPanel).show(snap, self.history)
        self.query_one(RunningTable).show(snap)
        self.query_one(WaitingTable).show(snap)
        # how many, also where the table has too few rows to show them all
        self.query_one(RunningTable).border_title = f"running {snap.running}"
        self.query_one(WaitingTable).border_title = f"waiting {snap.waiting}"
        self.query_one(CountersPanel).show(snap)
        self.query_one(TodayPanel).show(self.usage_today)
        self._place_today()
        self._log_events(snap)

    def _switched(self, model: str) -> None:
        """The snapshots are another engine's now: its figures start afresh (each engine has its
        own clock, sparklines and events)."""
        self.history.clear()
        self._last_event_t = -1.0
        self.query_one("#events", RichLog).write(Text(f"— the panels show {model} now —"))

    def _render_header(self) -> None:
        status = "paused" if self.paused else self.status
        connected = self.connected and not self.paused
        self.query_one(HeaderBar).show(
            self.snapshot, connected, status, self.usage_problem, self.models, self.watching
        )

    def _log_events(self, snap: Snapshot) -> None:
        log = self.query_one("#events", RichLog)
        for e in snap.events:
            if e.t <= self._last_event_t:
                continue
            self._last_event_t = e.t
            request = e.request_id.split(":", 1)[-1]  # events carry the engine's id only
            log.write(
                Text.assemble(
                    f"{e.t:6.1f}s ",
                    (e.user, user_color(e.user)),
                    f" {e.kind} {request}: {e.detail}",
                )
            )

    @property
    def tall(self) -> bool:
        """40 rows or more: bigger panels, and room for today's totals beside the event log."""
        return self.size.height >= 40

    def _place_today(self) -> None:
        """Today's totals once anyone has used the server today (the panel shows the totals last
        drawn): under the counters on a tall screen, else instead of the event log unless t
        asked for the log."""
        panel = self.query_one(TodayPanel)
        today = bool(panel.shown)
        placed = (today and (self.tall or not self.show_events), not today or self.tall)
        if placed != self._placed:
            self._placed = placed
            panel.display = placed[0]
            self.query_one("#events").display = not placed[0] or self.tall
            self.refresh_bindings()  # t shows in the footer only where it switches

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "next_model":
            return len(self.models) > 1  # False: not in the footer
        if action == "toggle_today":  # only where today's totals and the log take turns
            panels = self.query(TodayPanel)
            return bool(panels and panels.first().shown and not self.tall)  # False: hidden
        return True

    def on_resize(self) -> None:
        if not hasattr(self, "_main"):  # before mount: on_mount sets it up
            return
        self._main.set_class(self.tall, "tall")  # the main screen's, also under the help
        self._place_today()

    def action_toggle_today(self) -> None:
        self.show_events = not self.show_events
        self._place_today()

    def action_pause(self) -> None:
        self.paused = not self.paused
        if not self.paused:
            self.refresh_snapshot()
        self._render_header()

    def action_next_model(self) -> None:
        """The next model's engine in the panels (after the last, the first): the source
        subscribes to it, and its frames follow."""
        names = [m.name for m in self.models]
        if len(names) < 2:
            return
        shown = self.watching or (self.snapshot.model.model if self.snapshot else names[0])
        at = names.index(shown) + 1 if shown in names else 0
        self.watching = names[at % len(names)]
        if (watch := getattr(self.source, "watch", None)) is not None:  # a source that can
            self.run_worker(watch(self.watching), group="watch")
        self._render_header()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())
