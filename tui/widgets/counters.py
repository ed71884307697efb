"""The counters since the server started, broken across lines only between phrases.

Tested in tests/unit/tui/test_monitor.py.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from localserve.protocol.snapshot import Snapshot
from tui.format import plural
from tui.widgets.style import SEPARATOR


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
