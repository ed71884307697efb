"""The adaptive prefill budget: how many prompt tokens fit in a step that also carries decodes.

A step's time is modelled as `a + b * num_decode + c * num_prefill`, learned online from the
measured step times, in two parts that stay identifiable:
- the decode part `a + b * num_decode` by recursive least squares with forgetting, on steps
  without prefill (a long paste makes every step mixed, so a joint fit would let the intercept
  soak up the prefill cost and under-price prompt tokens);
- the prefill price `c` as a moving average of each mixed step's residual per prefill token; it
  follows the growing attention cost as a long prompt's chunks go deeper into the context;
- a factor on that price per batch size (buckets of BUCKET_TOKENS tokens, decodes included),
  learned the same way. A token's price is not the same at every batch size: on the CPU here a
  step of 3 decodes and 60 prompt tokens took 111 ms, one with 61 took 142 ms (llama.cpp's CPU
  flash attention changes path at 64 rows; docs/benchmarks.md). A bucket not seen yet takes the
  factor of the nearest smaller one seen, so one expensive step teaches every larger size.
A draft row (speculative decoding: a drafted token riding on a decode row, with logits of its
own) is priced apart (`DraftRowCost`): drafted steps teach it and not the decode fit, whose
`a + b * rows` could not say that the first extra logit row costs far more than the next.
An embedding token (localserve.engine.embedding: decoded on the runner's embedding context in the
same step, a decode of its own that the runner times) is priced apart, `e` per token, a moving
average of that decode's time per embedding token: it costs what a prompt token costs plus the
LM head's row, which every token of an embedding batch computes, plus its share of the decode's
fixed cost. The first such decode is no sample (it makes the embedding context and warms it
up). The rest of the step (its time less the embedding decode's) teaches the decode fit and the
prompt price as any step does, so they are not corrupted by embedding work.
The engine process's watchdog judges a running step by the model's prediction for it
(`predict`), and asks `is_measured` whether that prediction rests on a measured step of its
kind or only on the prior.

While sequences decode, the prefill budget is the chunk that advances prompts fastest (prompt
tokens per second of step) among those whose predicted step stays within the ITL target; with
one price for every size that is the largest such chunk.
"""

from __future__ import annotations

import math

from localserve.engine.waiting_line import WaitingLine

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
BUCKET_TOKENS = 8  # batch sizes priced alike
FACTOR_ALPHA = 0.3  # weight of the newest sample of a bucket's factor
EMBED_PRIOR_RATIO = 2.0  # an embedding token's price over a prompt token's, before one is measured
NEAR_BEST_RATE = 0.95  # the largest chunk within this share of the fastest one is taken


class StepCostModel:
    """Online model of step time against decode and prefill token counts."""

    def __init__(self, prior: tuple[float, float, float] = PRIOR, confidence: float = 1e-2):
        self._ab = [prior[0], prior[1]]
        self._p = [[1.0 / confidence, 0.0], [0.0, 1.0 / confidence]]  # RLS covariance
        self._c = prior[2]
        self._factors: dict[int, float] = {}  # batch-size bucket -> factor on the price c
        self._has_prefill_sample = False
        # an embedding decode: seconds fixed, per token (RLS, as the decode part)
        self._embed = [0.0, prior[2] * EMBED_PRIOR_RATIO]
        self._p_embed = [[1.0 / confidence, 0.0], [0.0, 1.0 / confidence]]
        self._has_embed_sample = False
        self._num_embed_steps = 0
        self._num_decode_fits = 0
        self.num_updates = 0

    @property
    def theta(self) -> list[float]:
        """(a, b, c): seconds per step, per decode token, per prefill token."""
        return [*self._ab, self._c]

    @property
    def decode_token_s(self) -> float:
        """Seconds per decode row (a draft row's price too), kept positive."""
        return max(self._ab[1], 1e-6)

    def predict(self, num_decode: int, num_prefill: int, num_embed: int = 0) -> float:
        a, b, _ = self.theta
        step = a + b * num_decode + self.prefill_s(num_decode, num_prefill)
        return max(0.0, step + self.embed_s(num_embed))

    def embed_s(self, num_embed: int) -> float:
        """The predicted time of an embedding decode of `num_embed` tokens (0 for none)."""
        return self.embed_fixed_s + self.embed_token_s * num_embed if num_embed else 0.0

    @property
    def embed_token_s(self) -> float:
        """Seconds per embedding token (kept positive)."""
        return max(self._embed[1], 1e-6)

    @property
    def embed_fixed_s(self) -> float:
        """Seconds an embedding decode costs whatever its size (kept >= 0)."""
        return max(self._embed[0], 0.0)

    def is_measured(self, num_decode: int, num_prefill: int, num_embed: int = 0) -> bool:
        """Whether the prediction for such a step rests on a measured step of its kind (one with
        embedding tokens, one with prompt tokens, or one of decodes only), not on the prior."""
        if num_embed and not self._has_embed_sample:
            return False
        if num_prefill >= MIN_PREFILL_FOR_FIT:
            return self._has_prefill_sample
        return self._num_decode_fits > 0

    @property
    def prefill_token_s(self) -> float:
        """Seconds per prefill token at the base price (kept positive so budgets stay finite)."""
        return max(self._c, 1e-6)

    def prefill_s(self, num_decode: int, num_prefill: int) -> float:
        """The predicted cost of the prompt tokens of a step (its decodes set the batch size)."""
        if not num_prefill:
            return 0.0
        return self.prefill_token_s * self.factor(num_decode + num_prefill) * num_prefill

    def factor(self, num_tokens: int) -> float:
        """The price factor for a batch of `num_tokens` (the nearest smaller bucket seen)."""
        bucket = num_tokens // BUCKET_TOKENS
        if bucket in self._factors:
            return self._factors[bucket]
        below = [b for b in self._factors if b < bucket]
        return self._factors[max(below)] if below else 1.0

    def update(
        self,
        num_decode: int,
        num_prefill: int,
        step_s: float,
        num_embed: int = 0,
        embed_s: float = 0.0,
    ) -> None:
        """Fold in one measured step (`embed_s`: the part of it its embedding decode took)."""
        if num_embed:
            self._fit_embed(num_embed, embed_s)
            step_s = max(0.0, step_s - embed_s)
            if not num_decode and not num_prefill:
                self.num_updates += 1
                return
        if num_prefill == 0:
            self._fit_decode(float(num_decode), step_s)
            self._num_decode_fits += 1
        elif num_prefill >= MIN_PREFILL_FOR_FIT:
            residual = step_s - max(0.0, self.predict(num_decode, 0))
            self._fit_prefill(max(residual / num_prefill, 1e-6), num_decode + num_prefill)
        self.num_updates += 1

    def _fit_embed(self, num_embed: int, embed_s: float) -> None:
        """An embedding decode's time against its tokens (the first one: no sample)."""
        self._num_embed_steps += 1
        if self._num_embed_steps == 1:
            return
        self._embed, self._p_embed = rls_step(self._embed, self._p_embed, num_embed, embed_s)
        self._has_embed_sample = True

    def _fit_prefill(self, sample: float, num_tokens: int) -> None:
        """Fold in one price per prompt token, seen in a batch of `num_tokens`."""
        bucket = num_tokens // BUCKET_TOKENS
        if not self._has_prefill_sample:  # the prior was a guess; a measurement is not
            self._c, self._has_prefill_sample = sample, True
            self._factors[bucket] = 1.0
        elif bucket not in self._factors:  # a new size: its factor, not the price, moves
            self._factors[bucket] = sample / self.prefill_token_s
        else:  # the price follows the depth; what is left over is this size's own
            self._c += PREFILL_ALPHA * (sample / self._factors[bucket] - self._c)
            factor = self._factors[bucket]
            self._factors[bucket] = factor + FACTOR_ALPHA * (sample / self.prefill_token_s - factor)

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
        """Prompt tokens for a step with `num_decode` decodes that stays within `target_s`:
        the largest chunk that advances prompts nearly as fast as the fastest one."""
        decode_s = self.predict(num_decode, 0)
        spare = target_s - decode_s
        candidates = []  # (chunk, prompt tokens per second of step)
        for lo, hi, price in self._stretches(num_decode, ceiling):
            chunk = min(hi, int(spare / price)) if spare > 0 else 0
            if chunk >= lo:  # the largest chunk of this stretch within the target
                candidates.append((chunk, chunk / (decode_s + price * chunk)))
        if not candidates:
            return min(floor, ceiling)
        best = max(rate for _, rate in candidates)
        budget = max(chunk for chunk, rate in candidates if rate >= NEAR_BEST_RATE * best)
        return max(min(floor, ceiling), budget)

    def chunk_for_rate(self, num_decode: int, rate: float, ceiling: int) -> int:
        """The smallest chunk (a multiple of BUCKET_TOKENS) whose step advances prompts by
        `rate` tokens per second (the ceiling when none does): a larger chunk also makes the
        step longer."""
        if not math.isfinite(rate):
            return ceiling
        a, b, _ = self.theta
        for lo, hi, price in self._stretches(num_decode, ceiling - 1):
            first = -(-lo // BUCKET_TOKENS) * BUCKET_TOKENS
            for chunk in range(max(first, BUCKET_TOKENS), hi + 1, BUCKET_TOKENS):
                if chunk >= rate * max(0.0, a + b * num_decode + price * chunk):
                    return chunk
        return ceiling

    def _stretches(self, num_decode: int, ceiling: int):
        """(first chunk, last chunk, price per token) of the chunks 1..`ceiling` that share one
        factor (the buckets seen are where it may change), smallest first."""
        first, last = num_decode + 1, num_decode + ceiling  # batch sizes
        edges = (b * BUCKET_TOKENS for b in self._factors)
        starts = sorted({first} | {n for n in edges if first < n <= last})
        for lo, hi in zip(starts, [*starts[1:], last + 1], strict=True):
            price = self.prefill_token_s * self.factor(lo)
            yield lo - num_decode, hi - 1 - num_decode, price


def deadline_rate(prefills, now: float, ttft_target_s: float, step_s: float) -> float:
    """Prompt tokens per second that give every prompt being prefilled (sequences) its first
    token within `ttft_target_s` of its arrival (earliest deadline first); infinite once a
    deadline is due before the step would end."""
    need, rate = 0, 0.0
    for seq in sorted(prefills, key=lambda s: s.arrival_time):
        need += seq.num_remaining
        left = seq.arrival_time + ttft_target_s - now
        if left <= step_s:
            return math.inf
        rate = max(rate, need / left)
    return rate


def waiting_for_room(pasting: set[str], line: WaitingLine) -> bool:
    """Whether a user other than those whose prompts are being prefilled (`pasting`) waits
    for room (cells, slots), not for their own cap: only they are helped, and fairly, when
    those prompts finish sooner."""
    if any(s.user not in pasting for s in line.requeued):
        return True
    running, cap = line.num_running, line.cap
    return any(user not in pasting and running.get(user, 0) < cap for user in line.queues)


class DraftRowCost:
    """What a step's draft rows add to it (speculative decoding), learned from drafted steps
    apart from the decode fit: `fixed_s` for having draft rows at all, plus `row_s` per row.

    Why apart, and why the fixed part: on the CPU llama.cpp computes a single logit row as a
    matrix-vector product and two or more as a matrix product, so one sequence's step went from
    11 ms to 24 ms with one draft row, then ~3 ms a row up to 48 (docs/benchmarks.md); with 16
    sequences a drafted step took ~9 ms more than its rows explain (the rejected cells' trims,
    the verification). Fitted into the decode part's `a + b * rows`, steps of one row and steps
    with a probe's two taught `b` = 12.6 ms a row: no draft could ever pay, and a long one
    would pay three times over. The fit is recursive least squares with forgetting on
    (1, rows) of each drafted decode-only step's time less the decode fit's prediction for it
    without its drafts (the decode fit learns from the rest, this fit's prediction taken
    off); before a drafted step is measured a row costs a decode row (`b`), and the per-row
    price moves only where drafts of several rows say so (one-row probes, most drafted steps
    at first, teach the fixed part)."""

    def __init__(self) -> None:
        self._d: list[float] | None = None  # (fixed_s, row_s) once measured
        self._p = [[1.0, 0.0], [0.0, 1e-3]]
        self.num_updates = 0

    def row_s(self, decode_token_s: float) -> float:
        """Seconds per draft row (kept positive)."""
        return max(self._d[1], 1e-6) if self._d else decode_token_s

    @property
    def fixed_s(self) -> float:
        """Seconds a step's draft rows cost together beyond their price per row."""
        return max(self._d[0], 0.0) if self._d else 0.0

    def extra_s(self, n: int, decode_token_s: float) -> float:
        """What n draft rows add to a step."""
        return self.fixed_s + n * self.row_s(decode_token_s) if n > 0 else 0.0

    def update(self, n: int, extra_s: float, decode_token_s: float) -> None:
        """One drafted step: `extra_s` measured beyond the step's prediction without drafts."""
        if n <= 0:
            return
        if self._d is None:
            self._d = [0.0, decode_token_s]
        self._d, self._p = rls_step(self._d, self._p, n, extra_s)
        self.num_updates += 1


def rls_step(theta: list[float], p: list[list[float]], n: float, y: float):
    """One recursive-least-squares step with forgetting of y = theta0 + theta1 * n; returns the
    new (theta, P), P kept symmetric, positive and bounded as the decode fit's."""
    x = (1.0, float(n))
    px = [p[i][0] * x[0] + p[i][1] * x[1] for i in range(2)]
    denom = max(FORGETTING + x[0] * px[0] + x[1] * px[1], 1e-12)
    gain = [v / denom for v in px]
    err = y - (theta[0] + theta[1] * x[1])
    theta = [theta[i] + gain[i] * err for i in range(2)]
    q = [[(p[i][j] - gain[i] * px[j]) / FORGETTING for j in range(2)] for i in range(2)]
    off = (q[0][1] + q[1][0]) / 2
    p = [[max(q[0][0], MIN_VARIANCE), off], [off, max(q[1][1], MIN_VARIANCE)]]
    trace = p[0][0] + p[1][1]
    if trace > MAX_TRACE:
        p = [[v * MAX_TRACE / trace for v in row] for row in p]
    return theta, p
