"""How the monitor and the diagnosis write numbers: durations, shares, counts, one-line text.

Every formatter answers "—" for a missing value (None, NaN, infinity) instead of raising.
Imports only the standard library, so the diagnosis stays free of Textual.

Tested in tests/unit/tui/test_monitor.py.
"""

from __future__ import annotations

import math
import unicodedata

MISSING = "—"


def _finite(x: float | None) -> bool:
    return x is not None and isinstance(x, int | float) and math.isfinite(x)


def duration(s: float | None) -> str:
    """Seconds as a short human duration: 85 ms, 1.2 s, 45 s, 3 min, 4 h."""
    if s is None or not math.isfinite(s):
        return MISSING
    if s < 1.0:
        return f"{s * 1000:.0f} ms"
    if s < 10.0:
        return f"{s:.1f} s"
    if s < 120.0:
        return f"{s:.0f} s"
    if s < 7200.0:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.0f} h"


def pct(x: float | None) -> str:
    """A share as a whole percentage: 0.234 -> 23%."""
    return f"{x * 100:.0f}%" if _finite(x) else MISSING


def number(x: float | None) -> str:
    """A whole number with thousands separators: 1234.6 -> 1,235."""
    return f"{x:,.0f}" if _finite(x) else MISSING


def rate(x: float | None) -> str:
    """A per-second rate for a narrow column: 1234.6 -> 1235 (no separators)."""
    return f"{x:.0f}" if _finite(x) else MISSING


def tokens(n: float | None) -> str:
    """A token count in at most five characters: 950, 9.8k, 12.3k, 123k, 1.2M, 50k (not 50.0k)."""
    if not _finite(n):
        return MISSING
    for scale, suffix in ((1, ""), (1e3, "k"), (1e6, "M"), (1e9, "G")):
        value = n / scale
        if suffix and abs(round(value, 1)) < 100:
            return f"{value:.1f}".removesuffix(".0") + suffix
        if round(value) < 1000:
            return f"{value:.0f}{suffix}"
    return f"{n / 1e9:.0f}G"


def size_of(used: float, budget: float) -> str:
    """Bytes used of a budget, in the budget's unit: "340/4,096 MiB", "1.2/16.0 GiB"."""
    if not (_finite(used) and _finite(budget)):
        return MISSING
    if budget >= 8 << 30:
        return f"{used / (1 << 30):,.1f}/{budget / (1 << 30):,.1f} GiB"
    return f"{used / (1 << 20):,.0f}/{budget / (1 << 20):,.0f} MiB"


def plural(count: int, noun: str, suffix: str = "s") -> str:
    """A count and its noun: 1 hit, 3 hits, 2 prefixes (suffix "es")."""
    return f"{count:,} {noun}" + ("" if count == 1 else suffix)


def span(seconds: float, window_s: float) -> str:
    """When a counter grew: over a whole counter window of a minute (give or take 5 s) "in the
    last minute", over a shorter history "in the last 12 s", within a second "just now"."""
    if seconds >= window_s - 5:
        return "in the last minute"
    return f"in the last {seconds:.0f} s" if seconds >= 1 else "just now"


# a user's name in the tables: "openwebui/alice" whole, longer ones cut short; on a narrow
# table (80 columns, today's totals beside it) less, so that the timings still show; a wide one
# gives a name what its other columns leave, up to WIDE_USER_WIDTH
USER_WIDTH = 16
NARROW_USER_WIDTH = 12
WIDE_USER_WIDTH = 24


MIXED_MARK = "≈"  # before a name whose letters mix scripts: it may look like someone else's
# scripts that one name mixes as a matter of course (Japanese, Korean): one script here
_SCRIPT_GROUPS = {"HIRAGANA": "CJK", "KATAKANA": "CJK", "HANGUL": "CJK"}


def mixes_scripts(name: str) -> bool:
    """Its letters are of more than one script ("dаve" with a Cyrillic а: Latin and Cyrillic),
    as look-alikes of other names are (the server refuses new ones that look like a known
    person's; names from elsewhere may still come)."""
    scripts = set()
    for ch in name:
        if unicodedata.category(ch).startswith("L"):
            script = unicodedata.name(ch, "?").split(" ")[0]
            scripts.add(_SCRIPT_GROUPS.get(script, script))
    return len(scripts) > 1


def user_label(user: str, limit: int = USER_WIDTH) -> str:
    """A user's name in at most `limit` characters. A trusted front-end's person
    ("openwebui/alice smith") keeps the person's part: the front-end's is shortened first
    ("openw…/alice smith"), then left as "…/" ("…/alice smith"), and only then is the person's
    cut ("…/alice s…"); cut at the end, all of one front-end's people would read alike. A name
    that mixes scripts is marked (MIXED_MARK before it)."""
    if mixes_scripts(user) and limit > 1:
        return MIXED_MARK + _label(user, limit - 1)
    return _label(user, limit)


def _label(user: str, limit: int) -> str:
    user = " ".join(user.split())
    frontend, sep, person = user.partition("/")
    if len(user) <= limit or not sep or not person:
        return clip(user, limit)
    room = limit - len(person) - 1  # for the front-end's part, before "/" and the person's
    if room >= 2:  # a letter of it and the ellipsis
        return clip(frontend, room) + "/" + person
    return "…/" + clip(person, limit - 2)


def person_width(user: str) -> int:
    """The fewest characters that keep a trusted front-end's person whole: "…/" and the
    person's part ("openwebui/alice smith": 13); 0 for anyone else's name."""
    user = " ".join(user.split())
    _, sep, person = user.partition("/")
    return min(len(user), len(person) + 2) if sep and person else 0


def clip(text: str, limit: int) -> str:
    """`text` on one line, cut to at most `limit` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
