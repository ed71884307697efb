"""The watchdog's verdict on one look at the serving engine, as a pure function of what it reads
(the step clock, the process's exit code, a reader's fault) and the times it remembers, and why
an engine process ended, in words. The watchdog that acts on the verdict, taking the engine down
and up again, is a thread of `EngineProcess` (parent.py): it changes the process's state under
the same lock as the entry points and the reader.

Tested in tests/unit/engine_process/test_watchdog.py.
"""

from __future__ import annotations

import contextlib
import signal
from typing import NamedTuple

from localserve.engine_process.step_clock import StepReading

# while nothing comes from the engine for HEARTBEAT_S, the watchdog asks it for a snapshot; an
# engine idle (no step running) that stays silent for SILENCE_S is stopped (SIGSTOP, a dead
# reader: nothing else would notice)
HEARTBEAT_S = 1.0
SILENCE_S = 5.0
WORKER_CHECK_S = 1.0  # while serving, a worker that refuses connections is gone: reload early


class WatchTimes(NamedTuple):
    """What the watchdog remembers between looks (seconds of `time.monotonic()`)."""

    heard: float  # the engine's last message
    quiet_since: float  # the last look that saw a step running
    pinged: float  # the last heartbeat asked
    checked: float  # the RPC workers' last check


class Verdict(NamedTuple):
    """One look's verdict. Kinds that stop the engine (`reason` says why, for the people whose
    requests fail): "fault" (the reader failed), "exited", "overran" (a step past its limit),
    "silent" (idle, and no answer for SILENCE_S). Kinds that let it run: "stepping" (a step
    within its limit: the silence is not judged) and "idle", which may ask for a heartbeat
    (`ping`) or a look at the RPC workers (`check_workers`)."""

    kind: str
    reason: str = ""
    ping: bool = False
    check_workers: bool = False


def has_overrun(reading: StepReading, now: float, step_timeout_s: float) -> bool:
    """Whether the running step has run past its limit (step_clock.py's rule)."""
    return bool(reading.started) and now - reading.started > reading.limit_s(step_timeout_s)


def watchdog_verdict(
    now: float,
    reading: StepReading,
    step_timeout_s: float,
    times: WatchTimes,
    fault: str = "",
    exit_code: int | None = None,
) -> Verdict:
    """What one look at the serving engine decides, from the step clock's `reading`, the
    watchdog's `times`, a reader's `fault` and the process's exit code (None: it runs)."""
    if fault:  # first: the process ends as the reader closes its end
        return Verdict("fault", fault)
    if exit_code is not None:
        return Verdict("exited", exit_reason(exit_code))
    if has_overrun(reading, now, step_timeout_s):
        why = f"a step took longer than {reading.describe_limit(step_timeout_s)}"
        return Verdict("overran", f"{why}, so the engine process was stopped")
    if reading.started:
        return Verdict("stepping")
    quiet = now - max(times.heard, times.quiet_since)
    if quiet > SILENCE_S:
        why = f"the engine process stopped answering (silent for {quiet:.0f} s while idle)"
        return Verdict("silent", why)
    ping = quiet > HEARTBEAT_S and now - times.pinged > HEARTBEAT_S
    idle_s = min(now - times.quiet_since, now - times.checked)
    return Verdict("idle", ping=ping, check_workers=idle_s > WORKER_CHECK_S)


def exit_reason(code: int | None) -> str:
    """Why the engine process ended, in words, from its exit code (None: it has not)."""
    if code is None:
        return "the engine process stopped answering"
    if code < 0:
        with contextlib.suppress(ValueError):
            name = signal.Signals(-code).name
            if name == "SIGABRT":
                return "llama.cpp aborted the engine process (SIGABRT)"
            return f"the engine process was killed ({name})"
    return f"the engine process exited with status {code}"
