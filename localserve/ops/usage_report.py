"""The usage report: what `localserve usage` reads from the record and prints.

Rows summed per local day, user and model (`by_day`), with totals per model over the period
(`by_model`), the `--since` argument (`parse_since`: today,
7d, 24h, a date or an ISO time), and the two ways out: a table for people (`table`) and one JSON
object per line (`day_dict`). The record's file is localserve/ops/usage_database.py's, the
server's writes localserve/ops/usage.py's.

Tested in tests/unit/cli/test_usage.py and tests/unit/ops/test_usage.py.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import sqlite3
import statistics

from localserve.config import ConfigError, ServerConfig
from localserve.ops.quotas import local_day_start, local_midnight


@dataclasses.dataclass
class DayUsage:
    day: str  # YYYY-MM-DD, local ("" in a total over the period)
    user: str  # "" in a model's total
    model: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    median_ttft_ms: float | None

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def by_day(db: sqlite3.Connection, since: float, user: str | None = None) -> list[DayUsage]:
    """Per local day, user and model since `since`: requests, tokens, median TTFT."""
    return _grouped(db, since, user, ("day", "user", "model"))


def by_model(db: sqlite3.Connection, since: float, user: str | None = None) -> list[DayUsage]:
    """Per model since `since`, everyone's (or `user`'s) requests together."""
    return _grouped(db, since, user, ("model",))


def _grouped(db: sqlite3.Connection, since: float, user: str | None, keys: tuple[str, ...]):
    where, args = "finished >= ?", [since]
    if user is not None:
        where += " AND user = ?"
        args.append(user)
    by = ", ".join(keys)  # column names of this module's, never the caller's text
    groups = db.execute(
        f"SELECT {by}, COUNT(*), SUM(prompt_tokens), SUM(cached_tokens), "
        f"SUM(completion_tokens) FROM requests WHERE {where} GROUP BY {by} ORDER BY {by}",
        args,
    ).fetchall()
    ttfts: dict[tuple, list[float]] = {}
    for *key, ttft in db.execute(
        f"SELECT {by}, ttft_ms FROM requests WHERE {where} AND ttft_ms IS NOT NULL", args
    ):
        ttfts.setdefault(tuple(key), []).append(ttft)
    days = []
    for *key, n, p, c, g in groups:
        names = dict(zip(keys, key, strict=True))
        row = (names.get("day", ""), names.get("user", ""), names["model"])
        days.append(DayUsage(*row, n, p, c, g, _median(ttfts.get(tuple(key)))))
    return days


def _median(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


# --- reports (`localserve usage`) ----------------------------------------------------------


def parse_since(text: str, now: float) -> float:
    """ "today", "7d" (today and the 6 days before), "24h", or a date or time (ISO 8601; local
    unless it says its offset)."""
    text = text.strip()
    if text.lower() == "today":
        return local_day_start(now)
    if found := re.fullmatch(r"([1-9][0-9]{0,4})([dDhH])", text):
        number = int(found[1])
        if found[2] in "hH":
            return now - number * 3600
        first = datetime.date.fromtimestamp(now) - datetime.timedelta(days=number - 1)
        return local_midnight(first)
    try:
        return datetime.datetime.fromisoformat(text).astimezone().timestamp()
    except (ValueError, OverflowError):
        raise ConfigError(
            f"--since: {text!r}: expected today, 7d, 24h (up to 99999) or 2026-11-01"
        ) from None


def day_dict(day: DayUsage) -> dict:
    return {
        "day": day.day,
        "user": day.user,
        "model": day.model,
        "requests": day.requests,
        "prompt_tokens": day.prompt_tokens,
        "cached_tokens": day.cached_tokens,
        "completion_tokens": day.completion_tokens,
        "cached_share": round(day.cached_share, 4),
        "median_ttft_ms": None if day.median_ttft_ms is None else round(day.median_ttft_ms, 1),
    }


def table(days: list[DayUsage], config: ServerConfig, models: list[DayUsage] = ()) -> str:
    """The report as a text table, then the totals per model over the period (`models`, from
    by_model; left out when one model served everything) and the users' quotas."""
    if not days:
        return "no requests recorded in this period"
    text = _columns(("day", "user", "model"), [(d.day, d.user, d.model) for d in days], days)
    if len(models) > 1:
        text += ["", "per model, the whole period:"]
        text += _columns(("model",), [(m.model,) for m in models], models)
    quotas = {
        d.user: limit
        for d in days
        if (limit := config.daily_tokens_per_user.get(d.user, config.daily_tokens))
    }
    if quotas:
        text.append("")
        text.append(
            "daily quotas (prompt tokens computed + tokens out): "
            + ", ".join(f"{u} {q:,}" for u, q in sorted(quotas.items()))
        )
    return "\n".join(text)


def _columns(heads: tuple[str, ...], names: list[tuple[str, ...]], rows: list[DayUsage]):
    """Lines of a table: the naming columns left-aligned, then the figures right-aligned."""
    header = (*heads, "requests", "tokens in", "cached", "tokens out", "median TTFT")
    lines = [header]
    for name, d in zip(names, rows, strict=True):
        ttft = "–" if d.median_ttft_ms is None else f"{d.median_ttft_ms:.0f} ms"
        figures = (
            f"{d.requests:,}",
            f"{d.prompt_tokens:,}",
            f"{d.cached_share:.0%}",
            f"{d.completion_tokens:,}",
            ttft,
        )
        lines.append((*name, *figures))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return [
        "  ".join(
            cell.ljust(w) if i < len(heads) else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in lines
    ]
