"""How much slower the steps are than this machine's own best: the sign of a busy machine.

A step's time depends on its shape (decode rows, prompt tokens); the fastest step of each shape
in the last SPAN_S seconds is what this machine does when nothing else competes. A step that
takes twice its shape's best, step after step, is a machine doing other work (other processes
on its cores, a throttled or shared GPU), not a heavier load: a heavier load is a different
shape. The step cost model (budget.py) is no reference for this: it learns the slow machine
within a few dozen steps, as it should for budgeting.

Pure Python, no I/O; tested in tests/unit/engine/test_slowdown.py.
"""

from __future__ import annotations

from collections import deque

from localserve.engine.stats import percentile

SPAN_S = 600.0  # a shape's best is the fastest of the last ten minutes
PREFILL_BUCKET = 32  # prompt tokens per step priced alike
MIN_SAMPLES = 3  # a shape seen fewer times has no best yet
RECENT_STEPS = 32  # the slowdown is the median over this many recent steps
MAX_SHAPES = 4096  # bounded: a new shape past this forgets the one seen longest ago


class Slowdown:
    """The fastest recent step of each shape, and the recent steps' ratio to it."""

    def __init__(self) -> None:
        # shape -> (time, step seconds) with increasing seconds: a sliding-window minimum
        self._best: dict[tuple[int, int], deque[tuple[float, float]]] = {}
        self._seen: dict[tuple[int, int], int] = {}
        self._ratios: deque[float] = deque(maxlen=RECENT_STEPS)

    def add(self, t: float, num_decode: int, num_prefill: int, step_s: float) -> None:
        """One measured step; its ratio to its shape's best (before this step) is kept."""
        shape = (num_decode, -(-num_prefill // PREFILL_BUCKET))
        window = self._best.get(shape)
        if window is None:
            if len(self._best) >= MAX_SHAPES:
                oldest = next(iter(self._best))
                del self._best[oldest], self._seen[oldest]
            window = self._best[shape] = deque()
            self._seen[shape] = 0
        while window and window[0][0] < t - SPAN_S:
            window.popleft()
        if window and self._seen[shape] >= MIN_SAMPLES:
            self._ratios.append(step_s / max(window[0][1], 1e-9))
        while window and window[-1][1] >= step_s:
            window.pop()
        window.append((t, step_s))
        self._seen[shape] += 1

    @property
    def ratio(self) -> float | None:
        """The median ratio of the recent steps to their shapes' best (None: none measured)."""
        if not self._ratios:
            return None
        return percentile(sorted(self._ratios), 50)
