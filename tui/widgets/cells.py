"""The KV cells: a bar of each sequence's cells in its user's colour, the shared and cached
cells and the free ones, and the numbers behind it; below them, while the prefix cache has
tiers, what host memory and the disk hold and how often they were restored from.

Tested in tests/unit/tui/test_monitor.py.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from localserve.protocol.snapshot import Snapshot
from tui.format import clip, plural, size_of
from tui.widgets.style import user_color


class KVBar(Static):
    """Each sequence's own cells coloured by its user, then the system prompts they share, the
    cached prefixes and the free cells."""

    _snap: Snapshot | None = None

    def show(self, snap: Snapshot) -> None:
        self._snap = snap
        self.set_class(has_tiers(snap), "tiers")  # a third line (monitor.tcss)
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
        text = Text.assemble(bar.text, "\n", kv_legend(snap, self.size.width - 1))
        if has_tiers(snap):
            text.append("\n" + tiers_legend(snap, self.size.width - 1))
        return text


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
    return Text(_fit(parts, width))


def has_tiers(snap: Snapshot) -> bool:
    """Whether the prefix cache has a tier below the cells, or a disk tier that is off."""
    return snap.host_tier.enabled or snap.disk_tier.enabled or bool(snap.disk_tier.problem)


def tiers_legend(snap: Snapshot, width: int) -> str:
    """The tiers below the cells: each one's bytes of its budget, the prefixes saved in it and
    its hits (restores from it), or why the disk is off; then the tokens restored in all."""
    parts = []
    for name, tier in (("host", snap.host_tier), ("disk", snap.disk_tier)):
        if tier.enabled:
            held = f"{size_of(tier.bytes, tier.budget_bytes)}, {tier.entries:,} saved"
            parts.append(f"{name} {held}, {plural(tier.hits, 'hit')}")
        elif tier.problem:  # why, in what the parts before it leave of the line
            room = width - len(" · ".join(parts)) - (4 if parts else 1)
            parts.append(clip(f"{name} off: {tier.problem}", max(room, 16)))
    restored = snap.host_tier.restored_tokens + snap.disk_tier.restored_tokens
    if restored:
        parts.append(f"restored {restored:,} tokens")
    return _fit(parts, width)


def _fit(parts: list[str], width: int) -> str:
    """As many parts as fit in `width` columns, in order; a part that does not fit is left out
    and shorter ones after it may fit (the first is always kept)."""
    line = ""
    for part in parts:
        candidate = f"{line} · {part}" if line else f" {part}"
        if len(candidate) <= width or not line:
            line = candidate
    return line
