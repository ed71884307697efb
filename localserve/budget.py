"""The adaptive prefill budget: how many prompt tokens fit in a step that also carries decodes.

A step's time is modelled as `a + b * num_decode + c * num_prefill`, fitted online by recursive
least squares with forgetting from the measured step times, so it tracks the machine (CPU or
GPU, other load) and the growing attention cost. While sequences decode, the prefill budget is
the number of prompt tokens that keeps the predicted step time within the ITL target.
"""

from __future__ import annotations

# Prior (seconds): roughly the CPU figures in LLAMA_NOTES; measurements take over within steps.
PRIOR = (0.010, 0.004, 0.002)
FORGETTING = 0.97
MAX_TRACE = 1e4


class StepCostModel:
    """Online fit of step time against decode and prefill token counts."""

    def __init__(self, prior: tuple[float, float, float] = PRIOR, confidence: float = 1e-2):
        self.theta = list(prior)
        # a weak prior: large covariance lets the first measurements dominate
        self._p = [[1.0 / confidence if i == j else 0.0 for j in range(3)] for i in range(3)]
        self.num_updates = 0

    def predict(self, num_decode: int, num_prefill: int) -> float:
        a, b, c = self.theta
        return max(0.0, a + b * num_decode + c * num_prefill)

    @property
    def prefill_token_s(self) -> float:
        """Seconds per prefill token (kept positive so budgets stay finite)."""
        return max(self.theta[2], 1e-6)

    def update(self, num_decode: int, num_prefill: int, step_s: float) -> None:
        """Fold in one measured step (recursive least squares with forgetting)."""
        x = (1.0, float(num_decode), float(num_prefill))
        p = self._p
        px = [sum(p[i][j] * x[j] for j in range(3)) for i in range(3)]
        denom = FORGETTING + sum(x[i] * px[i] for i in range(3))
        gain = [v / denom for v in px]
        err = step_s - sum(self.theta[i] * x[i] for i in range(3))
        self.theta = [self.theta[i] + gain[i] * err for i in range(3)]
        self._p = [[(p[i][j] - gain[i] * px[j]) / FORGETTING for j in range(3)] for i in range(3)]
        # without excitation (no prefill for a while) forgetting inflates P without bound
        trace = sum(self._p[i][i] for i in range(3))
        if trace > MAX_TRACE:
            self._p = [[v * MAX_TRACE / trace for v in row] for row in self._p]
        self.num_updates += 1

    def prefill_budget(self, num_decode: int, target_s: float, floor: int, ceiling: int) -> int:
        """Prompt tokens that keep a step with `num_decode` decodes within `target_s`."""
        spare = target_s - self.predict(num_decode, 0)
        budget = int(spare / self.prefill_token_s) if spare > 0 else 0
        return max(min(floor, ceiling), min(budget, ceiling))
