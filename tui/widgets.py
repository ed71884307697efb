"""The monitor's widgets: each one shows one part of a Snapshot (and the recent history).

Tested in tests/unit/tui/test_monitor.py.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Label, Sparkline, Static

from localserve.protocol.frames import ModelStatus, UserUsage
from localserve.protocol.snapshot import Device, Percentiles, Snapshot, Worker
from tui.format import (
    MISSING,
    NARROW_USER_WIDTH,
    USER_WIDTH,
    WIDE_USER_WIDTH,
    clip,
    duration,
    pct,
    person_width,
    plural,
    rate,
    tokens,
    user_label,
)

USER_COLORS = [
    "dodger_blue1",
    "orange1",
    "medium_purple1",
    "spring_green2",
    "hot_pink2",
    "gold1",
    "turquoise2",
    "salmon1",
]


_assigned: dict[str, str] = {}


def reset_colors() -> None:
    """Start the user -> colour assignment afresh (one monitor, one palette)."""
    _assigned.clear()


def known_color(user: str) -> str:
    """The user's colour if a live view (running, waiting, events) has given them one, else none:
    a list of everyone who used the server today must not use up the distinct colours."""
    return _assigned.get(user, "")


def user_color(user: str) -> str:
    """A colour per user: distinct for the first eight users seen, stable afterwards."""
    if user not in _assigned:
        taken = len(_assigned)
        _assigned[user] = (
            USER_COLORS[taken % len(USER_COLORS)]
            if taken < 64
            else (USER_COLORS[zlib.crc32(user.encode()) % len(USER_COLORS)])
        )
    return _assigned[user]


class HeaderBar(Static):
    """Model, backend, slots, cells, policy and budget; connection state, or the engine's
    problem and the usage record's. A model split across devices (RPC workers) gets a second
    line listing them."""

    _state: tuple[Snapshot | None, bool, str, str, Sequence[ModelStatus]] = (
        None, False, "", "", ()
    )  # fmt: skip

    def show(
        self,
        snap: Snapshot | None,
        connected: bool,
        status: str,
        usage_problem: str = "",
        models: Sequence[ModelStatus] = (),
    ) -> None:
        self._state = (snap, connected, status, usage_problem, models)
        hinted = not connected and "\n" in status  # a refused token's hint: all of it shown
        self.set_class(hinted, "hinted")
        self.set_class(not hinted and snap is not None and has_device_line(snap), "two-lines")
        self.refresh()

    def render(self) -> Text:
        """Drawn at the widget's current width (also after a resize)."""
        *state, models = self._state
        return header_text(*state, width=self.size.width, models=models)


SEPARATOR = " · "
PROBLEM_MIN = 30  # columns the engine's problem may take at least, the model's name or not


def header_text(
    snap: Snapshot | None,
    connected: bool,
    status: str,
    usage_problem: str,
    width: int,
    models: Sequence[ModelStatus] = (),
) -> Text:
    """The connection state (or, while connected, the engine's and the usage record's
    problems), then as many facts about the server as fit in `width` columns (a fact that does
    not fit is left out, never wrapped), each behind its own separator; then, for a split
    model, a line of its devices; a status's second line (a refused token's hint) instead."""
    text = Text(no_wrap=True, overflow="crop")
    status, _, hint = status.partition("\n")
    hint = "" if connected else hint
    problems = []
    if connected and snap is not None and snap.engine_problem.strip():
        problems.append(f"engine down: {snap.engine_problem.strip()}")
    if connected and snap is not None and usage_problem.strip():
        problems.append(f"usage not recorded: {usage_problem.strip()}")
    if problems:
        room = max(width - len(snap.model.model) - 4, PROBLEM_MIN)  # and " · " + the model's name
        text.append(clip("● " + "; ".join(problems), room), style="bold red")
        text.append(" ·", style="grey50")
    elif connected:
        text.append("● live", style="bold green")
    else:
        text.append(f"● {status}", style="bold red")
    if snap is None:
        return _with_hint(text, hint)
    m = snap.model
    where = m.backend if m.backend == "CPU" else f"{m.backend} {m.n_gpu_layers}/{m.n_layer}L"
    facts = [
        (m.model, "bold"),
        (where, ""),
        (f"{snap.max_num_seqs} slots", ""),
        (f"{snap.kv_total} cells", ""),
        (f"{snap.policy} ≤{snap.max_num_batched_tokens} tok/step", ""),
        (f"ITL ≤{duration(snap.itl_target_s)}", ""),
    ]
    if m.devices:
        del facts[1]  # the devices' line says where
    if len(models) > 1:  # several models: each with its state, after the engine's facts
        facts.append(("models: " + ", ".join(model_word(x) for x in models), ""))
    text.append(" ")
    for i, (fact, style) in enumerate(facts):
        sep = SEPARATOR if i else ""
        if i and text.cell_len + len(sep) + len(fact) > width:
            continue
        text.append(sep, style="grey50")
        text.append(fact, style=style)
    if hint:
        return _with_hint(text, hint)
    if has_device_line(snap):
        text.append("\n")
        text.append_text(devices_text(m.devices, snap.workers, width))
    return text


def _with_hint(text: Text, hint: str) -> Text:
    """The header and, below it, the hint (the widget wraps it: `#header.hinted`)."""
    if hint:
        text.append(f"\n{DEVICE_INDENT}{hint}")
    return text


def model_word(m: ModelStatus) -> str:
    """A model's state in a few words: "small loading (2 waiting)", "coder idle"."""
    state = m.state
    if state == "loaded":
        state = "busy" if m.busy else "idle"
    elif state == "loading" and m.waiting:
        state = f"loading ({m.waiting} waiting)"
    return f"{m.name} {state}"


def has_device_line(snap: Snapshot) -> bool:
    """A split model, or an RPC worker down: the header's second line."""
    return bool(snap.model.devices) or any(not w.up for w in snap.workers)


DEVICE_INDENT = "  "  # under the state's "●"


def devices_text(devices: Sequence[Device], workers: Sequence[Worker], width: int) -> Text:
    """Each device with its layers ("RPC1 10.0.0.2:50052 6L"), its KV cache where the line has
    room for it, and "down" in red on a worker found down; workers down that hold no device's
    layers follow. What does not fit is counted at the end ("+2 more")."""
    down = {w.endpoint for w in workers if not w.up}
    listed = {d.endpoint for d in devices}
    forms = (  # the most said that fits
        lambda d: f"{d.label} {d.layers}L, KV {d.kv_mib:,.0f} MiB",
        lambda d: f"{d.label} {d.layers}L",
        lambda d: f"{d.name} {d.layers}L",
    )
    extra = [
        (f"worker {w.endpoint}", True) for w in workers if not w.up and w.endpoint not in listed
    ]
    for form in forms:
        parts = [(form(d), bool(d.endpoint) and d.endpoint in down) for d in devices] + extra
        line = _device_parts(parts, width, whole=True)
        if line is not None:
            return line
    return _device_parts(parts, width, whole=False)


def _device_parts(parts: list[tuple[str, bool]], width: int, whole: bool) -> Text | None:
    """The parts in `width` columns after the indent, a down one in red with "down" after it.
    `whole`: all of them, or None when they do not fit; else those that fit and "+N more"."""
    text = Text(DEVICE_INDENT, no_wrap=True, overflow="crop")
    for i, (part, is_down) in enumerate(parts):
        sep = SEPARATOR if i else ""
        tail = " down" if is_down else ""
        left = len(parts) - i - 1  # after this one
        more = f"{SEPARATOR}+{left} more" if left and not whole else ""
        if i and text.cell_len + len(sep) + len(part) + len(tail) + len(more) > width:
            if whole:
                return None
            text.append(f"{SEPARATOR}+{left + 1} more", style="grey50")
            break
        text.append(sep, style="grey50")
        text.append(part, style="red" if is_down else "")
        if tail:
            text.append(tail, style="bold red")
    if whole and text.cell_len > width:
        return None
    return text


class DiagnosisLine(Static):
    """What limits the server right now, in plain words."""

    def show(self, level: str, headline: str) -> None:
        self.set_classes(f"level-{level}")
        self.update(Text(f" {headline}"))


class KVBar(Static):
    """Each sequence's own cells coloured by its user, then the system prompts they share, the
    cached prefixes and the free cells."""

    _snap: Snapshot | None = None

    def show(self, snap: Snapshot) -> None:
        self._snap = snap
        self.refresh()

    def render(self) -> Text:
        """Drawn at the widget's current width (also after a resize)."""
        snap = self._snap
        if snap is None:
            return Text(" KV cells: waiting for stats", style="grey50")
        bar = _CellBar(max(snap.kv_total, 1), max(self.size.width - 2, 10))
        for row in snap.seqs:
            color = user_color(row.user)
            bar.add(row.own_computed, "█", color)
            bar.add(max(row.own_cells - row.own_computed, 0), "▒", color)
        bar.add(shared_cells(snap), "▓", SHARED_COLOR)
        bar.add(min(max(snap.kv_cached, 0), snap.kv_used), "░", "grey62")
        bar.add(snap.kv_total, "·", "grey35")  # the rest
        return Text.assemble(bar.text, "\n", kv_legend(snap, self.size.width - 1))


SHARED_COLOR = "grey70"  # cells of a system prompt several sequences share: nobody's own


def shared_cells(snap: Snapshot) -> int:
    """Live cells no sequence holds alone: the cached system prompts running sequences share
    (each row's own cells leave them out; the cache holds them once)."""
    return max(snap.kv_live - sum(max(r.own_cells, 0) for r in snap.seqs), 0)


class _CellBar:
    """A row of glyphs for consecutive runs of cells; rounding at the run boundaries keeps the
    whole bar exactly `width` wide however many runs there are."""

    def __init__(self, total: int, width: int) -> None:
        self.total, self.width = total, width
        self.cells = 0.0
        self.text = Text(" ")

    def add(self, cells: float, glyph: str, style: str) -> None:
        start = self._column(self.cells)
        self.cells = min(self.cells + max(cells, 0.0), self.total)
        self.text.append(glyph * (self._column(self.cells) - start), style=style)

    def _column(self, cells: float) -> int:
        return round(cells / self.total * self.width)


def kv_legend(snap: Snapshot, width: int) -> Text:
    """The numbers behind the bar, as many parts as fit in `width` columns (most useful first)."""
    c = snap.counters
    cached = min(max(snap.kv_cached, 0), snap.kv_used)
    parts = [f"KV {snap.kv_live_used:,} used (█)"]
    if cached or snap.cached_prefixes:
        parts.append(f"{cached:,} cached (░) in {plural(snap.cached_prefixes, 'prefix', 'es')}")
    parts.append(f"{snap.kv_live:,} committed (▒)")
    if shared := shared_cells(snap):
        parts.append(f"{shared:,} shared (▓)")  # system prompts, counted once
    parts.append(f"{max(snap.kv_total - snap.kv_committed, 0):,} free")
    if c.prefix_hits or c.cached_tokens:
        parts.append(f"reused {c.cached_tokens:,} tokens in {plural(c.prefix_hits, 'hit')}")
    # slots as in the header (max_num_seqs): free sequence ids also count spares for caching
    parts.append(plural(max(snap.max_num_seqs - snap.running, 0), "free slot"))
    line = ""
    for part in parts:  # a part that does not fit is left out; shorter ones after it may fit
        candidate = f"{line} · {part}" if line else f" {part}"
        if len(candidate) <= width or not line:
            line = candidate
    return Text(line)


class LatencyPanel(Vertical):
    """TTFT, ITL and queue time percentiles, each with a sparkline of its p90."""

    NAMES = {"ttft": "TTFT", "itl": "ITL", "queue": "queue"}

    def compose(self) -> ComposeResult:
        for key, name in self.NAMES.items():
            with Horizontal(classes="metric-row"):
                yield Label(name, id=f"{key}-label", classes="metric-label")
                yield Sparkline([], id=f"{key}-spark", classes="metric-spark")

    def show(self, snap: Snapshot, history: Sequence[Snapshot]) -> None:
        for key, name in self.NAMES.items():
            p: Percentiles = getattr(snap, key)
            label = f"{name:<5} {duration(p.p50):>7}{duration(p.p90):>8}{duration(p.p99):>8}"
            self.query_one(f"#{key}-label", Label).update(label)
            values = [getattr(s, key).p90 or 0.0 for s in history]
            self.query_one(f"#{key}-spark", Sparkline).data = values or [0.0]


class ThroughputPanel(Vertical):
    """Prompt and generated tokens/s with sparklines; what each step carries."""

    def compose(self) -> ComposeResult:
        for key in ("prompt", "gen"):
            with Horizontal(classes="metric-row"):
                yield Label("", id=f"{key}-label", classes="metric-label")
                yield Sparkline([], id=f"{key}-spark", classes="metric-spark")
        yield Static("", id="batch")

    def show(self, snap: Snapshot, history: Sequence[Snapshot]) -> None:
        rows = {
            "prompt": ("prompt", "prompt_tokens_per_s"),
            "gen": ("gen", "generation_tokens_per_s"),
        }
        for key, (name, field) in rows.items():
            value = getattr(snap, field)
            self.query_one(f"#{key}-label", Label).update(f"{name:<6} {rate(value):>6} tok/s")
            self.query_one(f"#{key}-spark", Sparkline).data = [
                getattr(s, field) for s in history
            ] or [0.0]
        self.query_one("#batch", Static).update(batch_text(snap))


def batch_text(snap: Snapshot) -> Text:
    """Per-step composition: decode vs prefill tokens, as numbers and a bar."""
    st = snap.steps
    if st.step_s is None:
        return Text("step no steps yet", style="grey50")
    decode, prefill = st.decode_tokens or 0.0, st.prefill_tokens or 0.0
    width = 10
    cap = max(snap.max_num_batched_tokens, 1)
    d = min(width, round(decode / cap * width))
    p = min(width - d, round(prefill / cap * width))
    text = Text("step ")  # decode tokens green, prefill yellow
    text.append("█" * d, style="green")
    text.append("█" * p, style="yellow")
    text.append("·" * (width - d - p), style="grey35")
    text.append(f" {decode:.0f}+{prefill:.0f} tok, {duration(st.step_s)}")
    if st.draft_acceptance is not None:  # speculative decoding drafted in the recent steps
        per_decode = st.tokens_per_decode or 1.0
        text.append(
            f"\ndraft {st.draft_tokens or 0:.0f} rows/step, {st.draft_acceptance:.0%} kept: "
            f"{per_decode:.2f} tok per decode"
        )
    return text


class RunningTable(DataTable):
    """One row per running sequence."""

    # the timings right after the phase: at 80 columns the table shows user to tok/s, ITL
    # included; the counts and cached (prompt tokens reused from a cached prefix: the legend
    # above counts the reuse) come after them
    COLUMNS = (
        "user",
        "request",
        "phase",
        "TTFT",
        "ITL",
        "tok/s",
        "prompt",
        "gen",
        "idle",
        "cached",
    )
    OTHERS_WIDTH = 60  # what the columns after the user's take, up to ITL at least

    def on_mount(self) -> None:
        self.add_columns(*self.COLUMNS)
        self.cursor_type = "none"

    def show(self, snap: Snapshot) -> None:
        self.clear()
        width = user_width(self)
        for r in snap.seqs:
            if r.phase == "prefill":
                phase = "prefill " + pct(r.computed_tokens / max(r.prompt_tokens, 1))
            else:
                phase = "decode" + (f" ({r.num_preemptions}×↺)" if r.num_preemptions else "")
            self.add_row(
                Text(user_label(r.user, width), style=user_color(r.user)),
                r.client_id,
                phase,
                duration(r.ttft_s),
                duration(r.last_itl_s),
                rate(r.tokens_per_s),
                str(r.prompt_tokens),
                str(r.output_tokens),
                duration(r.since_last_token_s),
                str(r.cached_tokens),
            )


def user_width(table: DataTable) -> int:
    """How much of a user's name a table shows: less on a narrow one (80 columns), and on a
    wide one what its other columns leave (OTHERS_WIDTH), up to WIDE_USER_WIDTH."""
    width = table.size.width
    least = USER_WIDTH if width > 60 else NARROW_USER_WIDTH
    return max(least, min(WIDE_USER_WIDTH, width - table.OTHERS_WIDTH))


class WaitingTable(DataTable):
    """The queue, in admission order (the first row is admitted next)."""

    # the numbers first, the request id last: on a narrow screen only the id is cut short
    COLUMNS = ("user", "waited", "prompt", "request")
    OTHERS_WIDTH = 18  # waited and prompt (the request id is cut first)

    def on_mount(self) -> None:
        self.add_columns(*self.COLUMNS)
        self.cursor_type = "none"

    def show(self, snap: Snapshot) -> None:
        self.clear()
        width = user_width(self)
        for w in snap.waiting_seqs:
            request = w.client_id + (" (preempted)" if w.is_preempted else "")
            self.add_row(
                Text(user_label(w.user, width), style=user_color(w.user)),
                duration(w.waited_s),
                str(w.prompt_tokens),
                request,
            )


def counter_phrases(snap: Snapshot) -> list[str]:
    """The counters since start, each a phrase that is never broken across lines (at 80
    columns beside today's totals they take five lines, all the room there is)."""
    c = snap.counters
    return [
        f"finished {c.finished}",
        f"preempted {c.preemptions}",
        f"rejected {c.rejections}",
        f"cancelled {c.cancellations}",
        f"errors {c.errors}",
        f"reused {c.cached_tokens} tok in {plural(c.prefix_hits, 'hit')}",
        f"evicted {plural(c.prefix_evictions, 'prefix', 'es')}",
    ]  # running and waiting: in the tables' titles


def counters_text(snap: Snapshot, width: int = 10_000) -> str:
    """The counters in lines of at most `width` columns, broken only between phrases (the
    separator ends a line that goes on); a phrase longer than a line is cut at the edge."""
    lines = [""]
    phrases = counter_phrases(snap)
    for i, phrase in enumerate(phrases):
        line = lines[-1]
        goes_on = len(SEPARATOR.rstrip()) if i < len(phrases) - 1 else 0  # its trailing " ·"
        if line and len(line) + len(SEPARATOR) + len(phrase) + goes_on > width:
            lines[-1] = line + SEPARATOR.rstrip()
            lines.append(phrase)
        else:
            lines[-1] = f"{line}{SEPARATOR}{phrase}" if line else phrase
    return "\n".join(lines)


class CountersPanel(Static):
    """The counters since start, drawn at the widget's width, broken only between phrases."""

    _snap: Snapshot | None = None

    def show(self, snap: Snapshot) -> None:
        self._snap = snap
        self.refresh(layout=True)

    def render(self) -> Text:
        if self._snap is None:
            return Text("")
        text = counters_text(self._snap, max(self.content_size.width, 1))
        return Text(text, no_wrap=True, overflow="crop")


class TodayPanel(Static):
    """Today's totals per user (since the server's local midnight, most tokens first): requests,
    prompt tokens in and the share of them reused from the cache, tokens out, and used / quota
    for users with a daily quota. The column names sit in the border title (as the latency
    panel's do); users that do not fit are counted in the border subtitle."""

    _usage: Sequence[UserUsage] = ()

    @property
    def shown(self) -> Sequence[UserUsage]:
        """The totals drawn (empty before the first frame that had any)."""
        return self._usage

    def show(self, usage: Sequence[UserUsage]) -> None:
        self._usage = list(usage)
        self._retitle()
        self.refresh()

    def on_resize(self) -> None:
        self._retitle()

    def _table(self) -> TodayTable:
        """At the widget's current size: its title goes between "╭─ " and " ─╮"."""
        size = self.content_size
        return today_table(self._usage, size.width, size.height, self.size.width - 6)

    def _retitle(self) -> None:
        table = self._table()
        self.border_title, self.border_subtitle = table.title, table.more

    def render(self) -> Text:
        """Drawn at the widget's current size (also after a resize)."""
        return self._table().text


@dataclass
class _Column:
    head: str
    cells: list[Text]
    right: bool = True  # aligned right (numbers), or left

    @property
    def width(self) -> int:
        return max([len(self.head), *(c.cell_len for c in self.cells)])


@dataclass
class TodayTable:
    title: str  # "today" and the columns' heads, each above its column
    text: Text  # one line per user shown
    more: str = ""  # "+3 more" when not every user fits
    columns: tuple[str, ...] = ()  # the heads of the columns shown


TODAY_TITLE = "today"
TODAY_USER_WIDTH = 10  # the least of a name shown ("…/alice s…": format.user_label)
TODAY_USER_CAP = WIDE_USER_WIDTH  # the most, however wide the panel
TODAY_DROPPABLE = ("cached", "req", "out")  # left out in this order while the table is too wide
TITLE_SHIFT = 1  # the panel draws its title this many columns right of its text (its padding)


def today_table(
    usage: Sequence[UserUsage], width: int, height: int, title_width: int | None = None
) -> TodayTable:
    """The users that fit in `height` lines of `width` columns, and a title of at most
    `title_width` characters that names the columns shown, each head above its column."""
    rows = list(usage[: max(height, 1)])
    more = f"+{len(usage) - len(rows)} more" if len(usage) > len(rows) else ""
    title_width = width if title_width is None else title_width
    for user_width, droppable in _user_widths(rows):  # the widest names that fit, first
        columns = _today_columns(rows, user_width)
        if fitted := _fit(columns, width, title_width, droppable):
            columns, gap, title = fitted
            break
    else:  # too narrow even so: what is still too wide is cut at the edge
        columns = [c for c in columns if c.head not in TODAY_DROPPABLE]
        gap, title = 1, _title(columns, 1)
    text = Text(no_wrap=True, overflow="crop")
    for i in range(len(rows)):
        if i:
            text.append("\n")
        for k, column in enumerate(columns):
            cell = column.cells[i]
            last = k == len(columns) - 1
            pad = "" if last and not column.right else " " * (column.width - cell.cell_len)
            text.append(" " * gap if k else "")
            text.append_text(Text.assemble(pad, cell) if column.right else Text.assemble(cell, pad))
    return TodayTable(title, text, more, tuple(c.head for c in columns[1:]))


def _user_widths(rows: Sequence[UserUsage]) -> list[tuple[int, tuple[str, ...]]]:
    """The user column's widths to try, each with the columns that may be left out for it:
    the whole names (up to TODAY_USER_CAP) down to the trusted front-ends' persons' parts (or
    TODAY_USER_WIDTH) with every column; the persons' parts without "cached"; then
    TODAY_USER_WIDTH without any of TODAY_DROPPABLE."""
    whole = min(max((len(" ".join(u.user.split())) for u in rows), default=0), TODAY_USER_CAP)
    whole = max(whole, TODAY_USER_WIDTH)
    person = min(max((person_width(u.user) for u in rows), default=0), whole)
    person = max(person, TODAY_USER_WIDTH)
    widths: list[tuple[int, tuple[str, ...]]] = [(w, ()) for w in range(whole, person - 1, -1)]
    return [*widths, (person, ("cached",)), (TODAY_USER_WIDTH, TODAY_DROPPABLE)]


def _today_columns(rows: Sequence[UserUsage], user_width: int) -> list[_Column]:
    names = [user_label(u.user, user_width) for u in rows]
    # the user column: as wide as the title's "today" and a space before the next head
    user_head = " " * (len(TODAY_TITLE) + 2 - TITLE_SHIFT)
    users = [Text(n, style=known_color(u.user)) for n, u in zip(names, rows, strict=True)]
    columns = [
        _Column(user_head, users, right=False),
        _Column("req", [Text(f"{u.requests:,}") for u in rows]),
        _Column("in", [Text(tokens(u.prompt_tokens)) for u in rows]),
        _Column("cached", [_cached_share(u) for u in rows]),
        _Column("out", [Text(tokens(u.completion_tokens)) for u in rows]),
    ]
    if any(u.daily_tokens is not None for u in rows):
        columns.append(_Column("quota", [_quota(u) for u in rows], right=False))
    return columns


def _fit(
    columns: list[_Column], width: int, title_width: int, droppable: Sequence[str]
) -> tuple[list[_Column], int, str] | None:
    """The columns that fit in `width` (their title in `title_width`), two spaces apart or else
    one; while none do, the `droppable` ones are left out one by one; None when even without
    them they do not fit."""
    droppable = [head for head in droppable if any(c.head == head for c in columns)]
    while True:
        for gap in (2, 1):
            title = _title(columns, gap)
            fits = sum(c.width for c in columns) + gap * (len(columns) - 1) <= width
            if fits and len(title) <= title_width:
                return columns, gap, title
        if not droppable:
            return None
        head = droppable.pop(0)
        columns = [c for c in columns if c.head != head]


def _title(columns: list[_Column], gap: int) -> str:
    """The panel's title: "today" above the user column, then each column's head above it."""
    title, start = TODAY_TITLE, columns[0].width + gap  # start: where a column begins
    for column in columns[1:]:
        at = start + (column.width - len(column.head) if column.right else 0) - TITLE_SHIFT
        title += " " * max(at - len(title), 1) + column.head  # never two heads touching
        start += column.width + gap
    return title


def _cached_share(u: UserUsage) -> Text:
    if u.prompt_tokens <= 0:
        return Text(MISSING, style="grey50")
    return Text(pct(u.cached_tokens / u.prompt_tokens))


def _quota(u: UserUsage) -> Text:
    """used/quota, yellow from 80 % of the quota, red once it is spent."""
    if u.daily_tokens is None:
        return Text(MISSING, style="grey50")
    used = u.counted_tokens
    share = used / u.daily_tokens if u.daily_tokens > 0 else 1.0
    style = "bold red" if share >= 1 else "yellow" if share >= 0.8 else ""
    return Text(f"{tokens(used)}/{tokens(u.daily_tokens)}", style=style)
