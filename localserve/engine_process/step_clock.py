"""The step clock: when the engine's running step started, in memory both processes map.

The engine process writes it around each step (the engine's `watch` hook); the server's
watchdog reads it to stop a step that runs too long. Two doubles: when the running step started
(0: none runs) and how long the longest step so far took, in seconds of `time.monotonic()`
(one clock for every process of the machine).

Tested in tests/e2e/test_engine_faults.py.
"""

from __future__ import annotations

import ctypes
import mmap
import tempfile
import time
from typing import IO

SIZE = 16  # bytes: two doubles


class StepClock:
    """Two doubles in shared memory: `started` (0: no step runs) and `longest`."""

    def __init__(self, fd: int, file: IO[bytes] | None = None) -> None:
        self._file = file  # the parent's: closed with the clock
        self._map = mmap.mmap(fd, SIZE)
        self._times = (ctypes.c_double * 2).from_buffer(self._map)

    @classmethod
    def create(cls) -> StepClock:
        """A new clock, in a temporary file the engine process inherits (`fileno()`)."""
        file = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        file.truncate(SIZE)
        return cls(file.fileno(), file)

    def fileno(self) -> int:
        assert self._file is not None, "the engine process's clock has no file of its own"
        return self._file.fileno()

    @property
    def started(self) -> float:
        """When the running step started (0: none runs)."""
        return self._times[0]

    @property
    def longest(self) -> float:
        """How long the longest step so far took."""
        return self._times[1]

    def read(self) -> tuple[float, float]:
        """(started, longest)."""
        started, longest = self._times
        return started, longest

    def reset(self) -> None:
        """For a new engine process: no step runs, none ran."""
        self._times[0] = self._times[1] = 0.0

    def watch(self, running: bool) -> None:
        """The engine's watch hook: told True before each step, False after."""
        now = time.monotonic()
        if running:
            self._times[0] = now
        else:
            self._times[1] = max(self._times[1], now - self._times[0])
            self._times[0] = 0.0

    def close(self) -> None:
        del self._times  # the map cannot close while a view of it lives
        self._map.close()
        if self._file is not None:
            self._file.close()
