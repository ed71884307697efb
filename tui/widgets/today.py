"""Today's totals per user (requests, tokens in and out, the share cached, the quota), fitted
to the panel's width.

Tested in tests/unit/tui/test_monitor.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

from localserve.protocol.frames import UserUsage
from tui.format import MISSING, WIDE_USER_WIDTH, pct, person_width, tokens, user_label
from tui.widgets.style import known_color


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
