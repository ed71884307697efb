"""What an operator would conclude from the recent stats: one plain-words headline and its numbers.

`diagnose(history)` takes the monitor's recent `Snapshot`s, oldest first, and returns a
`Diagnosis`: a level (`ok` < `info` < `warn` < `bad`), a headline naming the most severe finding
and its likely mechanism, and detail lines with the numbers behind it, the other findings and a
picture of the moment. A pure function of the snapshots that never raises.

- `signals.py`: measures (`Signals`, computed once from the history).
- `rules.py`: concludes (one pure function per finding).
- `thresholds.py`: every number they judge by.
- `moment.py`: words the picture of the moment, and the healthy headline.

The reasoning table: docs/diagnosis.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from localserve.protocol.frames import ModelStatus
from localserve.protocol.snapshot import Snapshot
from tui.diagnosis.moment import now_lines, summary
from tui.diagnosis.rules import RULES, Finding, models_waiting, reported
from tui.diagnosis.signals import Signals, segment
from tui.diagnosis.thresholds import DETAIL_MAX, HEADLINE_MAX, LEVELS
from tui.format import clip

__all__ = ["HEADLINE_MAX", "LEVELS", "Diagnosis", "diagnose"]


class Diagnosis(msgspec.Struct, frozen=True):
    level: str  # "ok" | "info" | "warn" | "bad"
    headline: str  # one line, plain words, at most HEADLINE_MAX characters
    details: list[str] = msgspec.field(default_factory=list)  # supporting lines with numbers


def diagnose(history: Sequence[Snapshot], models: Sequence[ModelStatus] = ()) -> Diagnosis:
    """The most severe finding in `history` (oldest first) as a headline, the rest as details;
    `models` (the stats frame's) adds requests waiting for a model to load or for memory."""
    try:
        return _diagnose(list(history), list(models))
    except Exception as e:  # a monitor must keep running; the tests make sure this is never hit
        return Diagnosis("info", "no diagnosis: unexpected stats", [f"{type(e).__name__}: {e}"])


def _diagnose(history: list[Snapshot], models: list[ModelStatus]) -> Diagnosis:
    if not history:
        return Diagnosis("info", "no stats yet", ["waiting for the first snapshot from the server"])
    signals = Signals(segment(history))
    findings = reported([f for rule in RULES if (f := rule(signals)) is not None])
    if waiting := models_waiting(models):
        findings.insert(0, waiting)
    if not findings:
        findings.append(Finding("ok", "healthy: " + summary(signals), []))
    rank = {level: i for i, level in enumerate(LEVELS)}
    findings.sort(key=lambda f: -rank[f.level])  # stable: same level keeps the table's order
    top, rest = findings[0], findings[1:]
    details = list(top.details)
    details += [f"also ({f.level}): {f.headline}" for f in rest]
    details += now_lines(signals)
    return Diagnosis(
        top.level, clip(top.headline, HEADLINE_MAX), [clip(d, DETAIL_MAX) for d in details]
    )
