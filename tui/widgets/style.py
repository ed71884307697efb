"""What every widget draws with: a colour per user (the first eight distinct, stable after),
and the separator between the parts of a line.

Tested in tests/unit/tui/test_monitor.py.
"""

from __future__ import annotations

import zlib

SEPARATOR = " · "


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
