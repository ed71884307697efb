"""The step clock: the engine's running step, in memory both processes map, and its limit.

The engine process writes it around each step (the engine's `watch` and `expect` hooks): when
the running step started (0: none runs), what it carries (its decode and prompt tokens) and how
long it is expected to take. The server's watchdog reads it to stop a step that runs past its
limit, and /healthz, /metrics and the stats frames to say what runs while the engine is busy.
Times are seconds of `time.monotonic()` (one clock for every process of the machine).

The rule (docs/protocol.md, "When the engine stops"):

    expected = the cost model's prediction for the step's tokens (engine/budget.py, learned
               from this machine's measured steps) x slowness
    slowness = the largest ratio of a measured step's time to its prediction (each prediction
               taken as at least MIN_PREDICTED_S), at least 1, forgotten by half every
               SLOWNESS_HALF_LIFE_S: a machine that slows down raises the next predictions
    limit    = step_timeout_s + STEP_FACTOR x expected; a step the engine has not measured one
               of its kind of yet (the first with prompt tokens, the first of decodes only,
               after each start: its prediction is the prior's guess) has COLD_FACTOR x
               step_timeout_s instead of step_timeout_s

Tested in tests/unit/engine_process/test_step_clock.py and tests/e2e/test_engine_faults.py.
"""

from __future__ import annotations

import ctypes
import mmap
import tempfile
import time
from typing import IO, NamedTuple

STEP_FACTOR = 3.0  # a step may take this many times its expected time, plus step_timeout_s
COLD_FACTOR = 3.0  # ... and a step of a kind not measured yet this many times step_timeout_s
MIN_PREDICTED_S = 0.05  # a shorter prediction's ratio is taken against this (noise, not speed)
SLOWNESS_HALF_LIFE_S = 30.0

# the doubles in the shared memory
STARTED, EXPECTED, DECODE, PREFILL, MEASURED, SLOWNESS = range(6)
SIZE = 6 * 8  # bytes


class StepReading(NamedTuple):
    """One read of the clock."""

    started: float  # when the running step started (0: none runs)
    expected_s: float  # its expected time (0: nothing to compute, or not scheduled yet)
    decode_tokens: int
    prefill_tokens: int
    is_measured: bool  # False: its prediction is the prior's guess
    slowness: float

    def limit_s(self, step_timeout_s: float) -> float:
        """How long the step may run before the engine process is stopped."""
        margin = step_timeout_s if self.is_measured else COLD_FACTOR * step_timeout_s
        return margin + STEP_FACTOR * self.expected_s

    def describe_limit(self, step_timeout_s: float) -> str:
        """The limit, in words: where it comes from."""
        margin = f"step_timeout_s {step_timeout_s:g}"
        if not self.is_measured:
            margin = f"{COLD_FACTOR:g} × {margin} (no step like it measured yet)"
        return (
            f"{self.limit_s(step_timeout_s):.3g} s: {margin} + {STEP_FACTOR:g} × its expected "
            f"{self.expected_s:.2g} s for {self.prefill_tokens} prompt and "
            f"{self.decode_tokens} decode tokens"
        )


class StepClock:
    """The running step in shared memory: written by the engine process, read by the server."""

    def __init__(self, fd: int, file: IO[bytes] | None = None) -> None:
        self._file = file  # the parent's: closed with the clock
        self._map = mmap.mmap(fd, SIZE)
        self._times = (ctypes.c_double * 6).from_buffer(self._map)
        # the engine process's own: the running step's prediction, when slowness last moved
        self._predicted = 0.0
        self._learned_at = time.monotonic()

    @classmethod
    def create(cls) -> StepClock:
        """A new clock, in a temporary file the engine process inherits (`fileno()`)."""
        file = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        file.truncate(SIZE)
        clock = cls(file.fileno(), file)
        clock.reset()
        return clock

    def fileno(self) -> int:
        assert self._file is not None, "the engine process's clock has no file of its own"
        return self._file.fileno()

    @property
    def started(self) -> float:
        """When the running step started (0: none runs)."""
        return self._times[STARTED]

    def read(self) -> StepReading:
        t = list(self._times)  # one copy: the engine writes on
        return StepReading(
            t[STARTED], t[EXPECTED], int(t[DECODE]), int(t[PREFILL]), bool(t[MEASURED]), t[SLOWNESS]
        )

    def reset(self) -> None:
        """For a new engine process: no step runs, none ran."""
        t = self._times
        t[STARTED] = t[EXPECTED] = t[DECODE] = t[PREFILL] = 0.0
        t[MEASURED] = t[SLOWNESS] = 1.0

    # --- the engine process's side --------------------------------------------------------------

    def watch(self, running: bool) -> None:
        """The engine's watch hook: told True before each step, False after."""
        now = time.monotonic()
        t = self._times
        if running:  # nothing known of the step yet: it carries nothing until `expect`
            t[EXPECTED] = t[DECODE] = t[PREFILL] = 0.0
            t[MEASURED] = 1.0
            self._predicted = 0.0
            t[STARTED] = now
            return
        if self._predicted and t[MEASURED] and t[STARTED]:  # a guess teaches nothing
            self._learn(now - t[STARTED], now)
        t[STARTED] = 0.0

    def expect(self, num_decode: int, num_prefill: int, predicted_s: float, measured: bool) -> None:
        """The engine's expect hook: what the running step carries and its predicted time."""
        t = self._times
        self._predicted = predicted_s
        t[DECODE], t[PREFILL], t[MEASURED] = num_decode, num_prefill, float(measured)
        t[EXPECTED] = predicted_s * self._slowness(time.monotonic())

    def _slowness(self, now: float) -> float:
        """The largest recent ratio, forgotten by half every SLOWNESS_HALF_LIFE_S."""
        fade = 0.5 ** ((now - self._learned_at) / SLOWNESS_HALF_LIFE_S)
        return 1.0 + (self._times[SLOWNESS] - 1.0) * fade

    def _learn(self, took_s: float, now: float) -> None:
        ratio = took_s / max(self._predicted, MIN_PREDICTED_S)
        self._times[SLOWNESS] = max(ratio, self._slowness(now), 1.0)
        self._learned_at = now

    def close(self) -> None:
        del self._times  # the map cannot close while a view of it lives
        self._map.close()
        if self._file is not None:
            self._file.close()
