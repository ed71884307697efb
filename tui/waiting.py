"""The terminal chat's line while a reply waits for its turn: its place in line and the server's
predicted wait, counted down once a second between the server's updates ("model> 2nd in line ·
about 5 s"). On a terminal only: the line is rewritten in place, and cleared when the reply's
first text comes.

Tested in tests/unit/tui/test_waiting.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

PROMPT = "model> "
CLEAR = "\r\x1b[K"  # back to the line's start, and erase it


def ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def about(seconds: float) -> str:
    """A predicted wait as a person says it: "about 5 s", "about 2 min", "any moment now"."""
    s = round(seconds)
    if s <= 0:
        return "any moment now"
    return f"about {s} s" if s < 60 else f"about {round(s / 60)} min"


def waiting_words(position: int, wait_s: float | None, loading: str = "") -> str:
    if loading:
        return f"{loading}…"
    words = f"{ordinal(max(position, 1))} in line"
    return words if wait_s is None else f"{words} · {about(wait_s)}"


class WaitLine:
    """The waiting line of one reply: `update` with each `queued` frame, `clear` at its first
    text. `write` is print-like (text, end="")."""

    def __init__(self, write: Callable[..., None], clock: Callable[[], float] = time.monotonic):
        self._write, self._clock = write, clock
        self._position, self._loading = 1, ""
        self._enters_at: float | None = None
        self._ticker: asyncio.Task | None = None
        self.shown = False

    def update(self, position: int, wait_s: float | None, loading: str = "") -> None:
        self._position, self._loading = position, loading
        self._enters_at = None if wait_s is None else self._clock() + wait_s
        self._show()
        if self._ticker is None and self._enters_at is not None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    def text(self) -> str:
        left = None if self._enters_at is None else self._enters_at - self._clock()
        return waiting_words(self._position, left, self._loading)

    def clear(self) -> None:
        """The reply starts (or ended): the line is back to the bare prompt."""
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if self.shown:
            self._write(CLEAR + PROMPT, end="")
            self.shown = False

    def _show(self) -> None:
        self._write(f"{CLEAR}{PROMPT}[{self.text()}]", end="")
        self.shown = True

    async def _tick(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await asyncio.sleep(1.0)
                self._show()
