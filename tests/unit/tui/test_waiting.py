"""The terminal chat's waiting line (tui/waiting.py): the place in line and the predicted wait,
counted down between the server's updates, cleared when the reply starts."""

from __future__ import annotations

import asyncio

from tui.waiting import CLEAR, PROMPT, WaitLine, about, waiting_words


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_words():
    assert waiting_words(1, None) == "1st in line"
    assert waiting_words(2, 5.4) == "2nd in line · about 5 s"
    assert waiting_words(13, 130) == "13th in line · about 2 min"
    assert waiting_words(3, -1) == "3rd in line · any moment now"
    assert waiting_words(1, 3, loading="loading model big") == "loading model big…"
    assert about(59.4) == "about 59 s"


def test_the_line_counts_down_and_is_cleared_by_the_reply():
    written: list[str] = []
    clock = Clock()

    async def run() -> None:
        line = WaitLine(lambda text, end="": written.append(text), clock)
        line.update(3, 10.0)
        assert written[-1] == f"{CLEAR}{PROMPT}[3rd in line · about 10 s]"
        clock.now += 4
        await asyncio.sleep(1.05)  # the line's own second
        assert written[-1] == f"{CLEAR}{PROMPT}[3rd in line · about 6 s]"
        line.update(1, 2.0)  # others left: the server's update
        assert written[-1] == f"{CLEAR}{PROMPT}[1st in line · about 2 s]"
        line.clear()
        assert written[-1] == CLEAR + PROMPT
        count = len(written)
        await asyncio.sleep(1.1)
        assert len(written) == count  # no countdown once the reply started

    asyncio.run(run())
