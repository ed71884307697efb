"""The adaptive prefill budget: how many prompt tokens fit in a step that also carries decodes.

A step's time is modelled as `a + b * num_decode + c * num_prefill`, learned online from the
measured step times, in two parts that stay identifiable:
- the decode part `a + b * num_decode` by recursive least squares with forgetting, on steps
  without prefill (a long paste makes every step mixed, so a joint fit would let the intercept
  soak up the prefill cost and under-price prompt tokens);
- the prefill price `c` as a moving average of each mixed step's residual per prefill token; it
  follows the growing attention cost as a long prompt's chunks go deeper into the context.
While sequences decode, the prefill budget is the number of prompt tokens that keeps the
predicted step time within the ITL target.
"""

from __future__ import annotations

# Prior (seconds): roughly this CPU's figures (docs/benchmarks.md). It only prices the first steps:
# the decode fit starts nearly uninformed (low confidence) and the first measured mixed step
# replaces the prefill price outright, so a GPU, where a step costs a few milliseconds, is priced
# by its own measurements from its first steps on (nothing here assumes CPU timings).
PRIOR = (0.010, 0.004, 0.002)
FORGETTING = 0.97
MAX_TRACE = 1e4
MIN_VARIANCE = 1e-6
PREFILL_ALPHA = 0.3  # weight of the newest prefill-price sample
MIN_PREFILL_FOR_FIT = 8  # smaller chunks say more about noise than about the price


class StepCostModel:
    """Online model of step time against decode and prefill token counts."""

    def __init__(self, prior: tuple[float, float, float] = PRIOR, confidence: float = 1e-2):
        self._ab = [prior[0], prior[1]]
        self._p = [[1.0 / confidence, 0.0], [0.0, 1.0 / confidence]]  # RLS covariance
        self._c = prior[2]
        self._has_prefill_sample = False
        self.num_updates = 0

    @property
    def theta(self) -> list[float]:
        """(a, b, c): seconds per step, per decode token, per prefill token."""
        return [*self._ab, self._c]

    def predict(self, num_decode: int, num_prefill: int) -> float:
        a, b, c = self.theta
        return max(0.0, a + b * num_decode + c * num_prefill)

    @property
    def prefill_token_s(self) -> float:
        """Seconds per prefill token (kept positive so budgets stay finite)."""
        return max(self._c, 1e-6)

    def update(self, num_decode: int, num_prefill: int, step_s: float) -> None:
        """Fold in one measured step."""
        if num_prefill == 0:
            self._fit_decode(float(num_decode), step_s)
        elif num_prefill >= MIN_PREFILL_FOR_FIT:
            residual = step_s - max(0.0, self.predict(num_decode, 0))
            sample = max(residual / num_prefill, 1e-6)
            if not self._has_prefill_sample:  # the prior was a guess; a measurement is not
                self._c, self._has_prefill_sample = sample, True
            else:
                self._c += PREFILL_ALPHA * (sample - self._c)
        self.num_updates += 1

    def _fit_decode(self, num_decode: float, step_s: float) -> None:
        """Recursive least squares with forgetting on (1, num_decode)."""
        x = (1.0, num_decode)
        p = self._p
        px = [p[i][0] * x[0] + p[i][1] * x[1] for i in range(2)]
        denom = max(FORGETTING + x[0] * px[0] + x[1] * px[1], 1e-12)
        gain = [v / denom for v in px]
        err = step_s - (self._ab[0] + self._ab[1] * num_decode)
        self._ab = [self._ab[i] + gain[i] * err for i in range(2)]
        q = [[(p[i][j] - gain[i] * px[j]) / FORGETTING for j in range(2)] for i in range(2)]
        # keep P symmetric and positive: rounding on long exact runs can otherwise collapse it
        off = (q[0][1] + q[1][0]) / 2
        self._p = [[max(q[0][0], MIN_VARIANCE), off], [off, max(q[1][1], MIN_VARIANCE)]]
        # without excitation (one decode count for a long time) forgetting inflates P unbounded
        trace = self._p[0][0] + self._p[1][1]
        if trace > MAX_TRACE:
            self._p = [[v * MAX_TRACE / trace for v in row] for row in self._p]

    def prefill_budget(self, num_decode: int, target_s: float, floor: int, ceiling: int) -> int:
        """Prompt tokens that keep a step with `num_decode` decodes within `target_s`."""
        spare = target_s - self.predict(num_decode, 0)
        budget = int(spare / self.prefill_token_s) if spare > 0 else 0
        return max(min(floor, ceiling), min(budget, ceiling))
