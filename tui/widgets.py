"""The monitor's widgets: each one shows one part of a Snapshot (and the recent history)."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Label, Sparkline, Static

from localserve.protocol import Percentiles, Snapshot
from tui.format import duration, pct, plural, rate

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
    """Model, backend, slots, cells, policy and budget; connection state."""

    _state: tuple[Snapshot | None, bool, str] = (None, False, "")

    def show(self, snap: Snapshot | None, connected: bool, status: str) -> None:
        self._state = (snap, connected, status)
        self.refresh()

    def render(self) -> Text:
        """Drawn at the widget's current width (also after a resize)."""
        return header_text(*self._state, width=self.size.width)


SEPARATOR = " · "


def header_text(snap: Snapshot | None, connected: bool, status: str, width: int) -> Text:
    """The connection state, then as many facts about the server as fit in `width` columns (a
    fact that does not fit is left out, never wrapped), each behind its own separator."""
    text = Text()
    if connected:
        text.append("● live", style="bold green")
    else:
        text.append(f"● {status}", style="bold red")
    if snap is None:
        return text
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
    text.append(" ")
    for i, (fact, style) in enumerate(facts):
        sep = SEPARATOR if i else ""
        if i and text.cell_len + len(sep) + len(fact) > width:
            continue
        text.append(sep, style="grey50")
        text.append(fact, style=style)
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
    return text


class RunningTable(DataTable):
    """One row per running sequence."""

    # cached (prompt tokens reused from a cached prefix) comes last: at 80 columns the timings
    # matter more and the legend above already counts the reuse
    COLUMNS = (
        "user",
        "request",
        "phase",
        "prompt",
        "gen",
        "tok/s",
        "TTFT",
        "ITL",
        "idle",
        "cached",
    )

    def on_mount(self) -> None:
        self.add_columns(*self.COLUMNS)
        self.cursor_type = "none"

    def show(self, snap: Snapshot) -> None:
        self.clear()
        for r in snap.seqs:
            if r.phase == "prefill":
                phase = "prefill " + pct(r.computed_tokens / max(r.prompt_tokens, 1))
            else:
                phase = "decode" + (f" ({r.num_preemptions}×↺)" if r.num_preemptions else "")
            self.add_row(
                Text(r.user, style=user_color(r.user)),
                r.client_id,
                phase,
                str(r.prompt_tokens),
                str(r.output_tokens),
                rate(r.tokens_per_s),
                duration(r.ttft_s),
                duration(r.last_itl_s),
                duration(r.since_last_token_s),
                str(r.cached_tokens),
            )


class WaitingTable(DataTable):
    """The queue, in admission order (the first row is admitted next)."""

    # the numbers first, the request id last: on a narrow screen only the id is cut short
    COLUMNS = ("user", "waited", "prompt", "request")

    def on_mount(self) -> None:
        self.add_columns(*self.COLUMNS)
        self.cursor_type = "none"

    def show(self, snap: Snapshot) -> None:
        self.clear()
        for w in snap.waiting_seqs:
            request = w.client_id + (" (preempted)" if w.is_preempted else "")
            self.add_row(
                Text(w.user, style=user_color(w.user)),
                duration(w.waited_s),
                str(w.prompt_tokens),
                request,
            )


def counters_text(snap: Snapshot) -> str:
    c = snap.counters
    return (
        f"finished {c.finished} · preempted {c.preemptions} · rejected {c.rejections} · "
        f"cancelled {c.cancellations} · errors {c.errors} · reused {c.cached_tokens} tok in "
        f"{plural(c.prefix_hits, 'hit')} · evicted {plural(c.prefix_evictions, 'prefix', 'es')} · "
        f"running {snap.running} · waiting {snap.waiting}"
    )
