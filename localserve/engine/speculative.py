"""Speculative decoding with n-gram drafts: more than one token per sequence per step.

Pure Python, no I/O. A decoding sequence whose last tokens already occurred earlier in its own
prompt or output (a text it is asked to repeat, correct, quote or continue) gets a *draft*: the
tokens that followed that earlier occurrence (prompt lookup, as vLLM's n-gram proposer and
llama.cpp's `ngram-simple`). The step then carries its last token plus the draft, every row with
logits; the runner draws the target's token at each row in order with the request's own sampler
and keeps the draft while they agree (`verify_draft`). The first disagreement is kept too (it is
the target's own token), so a step gives between 1 and k + 1 tokens, and the cells of the
rejected draft tokens are trimmed before anything else decodes.

Why drawing and comparing keeps the target distribution exactly, also with temperature > 0: an
n-gram draft is one token d with probability 1, and speculative sampling's rule for it is
"accept d with probability p(d), otherwise sample from p with d removed (renormalised)".
Drawing y ~ p and accepting when y == d does exactly that: P(accept) = p(d), and a rejected y
is distributed as p(x) / (1 - p(d)) over x != d. It also draws once per token kept, as decoding
without drafts does, so a seeded request gives the same reply with speculation on and off.

Which drafts go into a step (`plan_drafts`) is a question of cost. Each sequence learns its own
acceptance rate (`DraftStats`: a decaying count, drifting back to a prior while it drafts
nothing; a sequence whose rate does not pay probes with one draft token at intervals that
double while its drafts fail, and after two drafted steps in a row that kept nothing it only
probes); the j-th draft
token is worth its chance of being reached and accepted, alpha^j. A draft row costs what the step
cost model says a draft row costs (`StepCostModel`'s draft price); a token is worth the step's
time per token it already produces. A row goes in only while its worth exceeds its price
(throughput rises), the step stays within the ITL target, the batch's token and logit-row limits
hold and the pool has free cells above its watermark. Rows are dealt round-robin across users,
one at a time, each user's most valuable first: one user's eight streams of drafts get no more
of the step than another user's one. On a large batch a row's price exceeds what it can return,
and speculation backs off by itself.

Tested in tests/unit/engine/test_speculative.py and tests/unit/engine/test_scheduler.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from localserve.engine.batch import Sampled

MIN_NGRAM = 2  # a single repeated token says little about what follows it
MAX_NGRAM = 4
PRIOR = 0.5  # acceptance rate assumed before a sequence has drafted
PRIOR_WEIGHT = 2.0  # ... worth this many observed draft tokens
DECAY = 0.8  # per step with a draft: older outcomes fade
IDLE_DECAY = 0.9  # per step without one: the estimate drifts back to the prior
MAX_PROBE_WAIT = 64  # steps: the longest a sequence waits between probes
BACK_OFF_AFTER = 2  # drafted steps in a row that kept nothing: then it only probes


class NgramDrafter:
    """Prompt lookup over one sequence's tokens: the continuation of the most recent earlier
    occurrence of its last n tokens (n from MAX_NGRAM down to MIN_NGRAM).

    Indexed incrementally: each table maps an n-gram to the position after its latest
    occurrence, for every n-gram whose continuation is known (that ends before the last token),
    so a lookup never finds the suffix itself."""

    __slots__ = ("_tables", "_indexed")

    def __init__(self) -> None:
        self._tables: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(MIN_NGRAM, MAX_NGRAM + 1)
        }
        self._indexed = 0  # n-grams ending before this position are in the tables

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest suffix."""
        if k <= 0:
            return []
        self._index(tokens)
        end = len(tokens)
        for n in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
            if end < n:
                continue
            at = self._tables[n].get(tuple(tokens[end - n :]))
            if at is not None:
                return tokens[at : at + k]
        return []

    def _index(self, tokens: list[int]) -> None:
        last = len(tokens) - 1  # the n-gram ending at i continues at i + 1
        for i in range(self._indexed, last):
            for n, table in self._tables.items():
                if i + 1 >= n:
                    table[tuple(tokens[i + 1 - n : i + 1])] = i + 1
        self._indexed = max(self._indexed, last)


class DraftStats:
    """A sequence's draft acceptance rate, learned from its own verified drafts.

    A sequence whose rate does not pay for a row would never draft, and so never learn that
    its text has become a repetition: it *probes* instead, one draft token now and then, at
    intervals that double after every drafted step that kept nothing (up to MAX_PROBE_WAIT
    steps) and halve after one that kept something. After BACK_OFF_AFTER drafted steps in a row
    that kept nothing it only probes, whatever its rate says, until a probe is kept: the rate's
    prior keeps it from reaching 0, and on a device where a row costs little next to a step it
    would otherwise go on drafting."""

    __slots__ = ("accepted", "tried", "probe_wait", "idle", "failures")

    def __init__(self) -> None:
        self.accepted = 0.0  # decayed counts of draft tokens accepted / judged
        self.tried = 0.0
        self.probe_wait = 1  # steps without a draft before the next probe
        self.idle = 0  # steps since its last draft
        self.failures = 0  # drafted steps in a row that kept no draft token

    @property
    def may_probe(self) -> bool:
        return self.idle >= self.probe_wait

    @property
    def backing_off(self) -> bool:
        """Its drafts keep failing: it only probes."""
        return self.failures >= BACK_OFF_AFTER

    @property
    def rate(self) -> float:
        """The chance that a draft token is accepted, given that the ones before it were."""
        return (self.accepted + PRIOR * PRIOR_WEIGHT) / (self.tried + PRIOR_WEIGHT)

    def update(self, num_drafted: int, num_accepted: int) -> None:
        """One step's outcome: a draft of `num_drafted` tokens of which the first
        `num_accepted` were kept (the one after them, if any, was judged and rejected)."""
        if not num_drafted:
            self.accepted *= IDLE_DECAY
            self.tried *= IDLE_DECAY
            self.idle += 1
            return
        self.idle = 0
        if num_accepted:
            self.probe_wait = max(1, self.probe_wait // 2)
            self.failures = 0
        else:
            self.probe_wait = min(MAX_PROBE_WAIT, self.probe_wait * 2)
            self.failures += 1
        judged = num_accepted + (num_accepted < num_drafted)
        self.accepted = self.accepted * DECAY + num_accepted
        self.tried = self.tried * DECAY + judged


class Candidate(NamedTuple):
    """A sequence that could carry a draft this step (its decode row is in the batch)."""

    key: object  # returned with its planned length
    user: str
    rate: float  # DraftStats.rate
    draft_len: int  # tokens the drafter proposed (the most it may carry)
    probe: bool = False  # DraftStats.may_probe: one row even where the rate does not pay
    probe_only: bool = False  # DraftStats.backing_off: no row but a probe


class DraftCosts(NamedTuple):
    """What the step costs, from the step cost model."""

    step_s: float  # the step as scheduled, without drafts
    num_tokens: int  # tokens it already produces (its decode rows)
    row_s: float  # one draft row
    limit_s: float  # the ITL target: the step may not be predicted longer with its drafts
    # the step's predicted time with n draft rows (the cost model's, which prices a batch's
    # prompt tokens by its size); None: step_s + n * row_s
    step_with: Callable[[int], float] | None = None

    def with_rows(self, n: int) -> float:
        return self.step_with(n) if self.step_with else self.step_s + n * self.row_s


def plan_drafts(candidates: list[Candidate], costs: DraftCosts, max_rows: int) -> dict[object, int]:
    """How many draft tokens each candidate carries (only those with at least one).

    Rows are dealt one at a time, round-robin over users in the candidates' order; a user's
    row goes to its sequence whose next draft token is most likely accepted. A row is added
    only while its expected tokens (rate^j for a sequence's j-th) exceed what the same time
    buys without drafts (row_s * tokens / step_s), and while the step stays within limit_s.
    """
    planned: dict[object, int] = {}
    if max_rows <= 0 or costs.row_s <= 0 or not candidates:
        return planned
    step_s, tokens = max(costs.step_s, 1e-9), float(max(costs.num_tokens, 1))
    limit_s = costs.limit_s + 1e-9  # (a step exactly at the target is within it)
    users: dict[str, list[Candidate]] = {}
    for c in candidates:
        if c.draft_len > 0 and not c.probe_only:
            users.setdefault(c.user, []).append(c)
    rows = 0
    while users and rows < max_rows:
        for user in list(users):
            best, worth = _best(users[user], planned)
            if best is None:
                del users[user]
                continue
            if worth * step_s <= costs.row_s * tokens or costs.with_rows(rows + 1) > limit_s:
                del users[user]  # its best row does not pay: none of its others would
                continue
            planned[best.key] = planned.get(best.key, 0) + 1
            rows += 1
            step_s += costs.row_s
            tokens += worth
            if rows >= max_rows:
                break
    for c in candidates:  # probes: one row each, in the time and rows left
        if c.probe and c.draft_len and c.key not in planned and rows < max_rows:
            if costs.with_rows(rows + 1) > limit_s:
                break
            planned[c.key] = 1
            rows += 1
            step_s += costs.row_s
    return planned


def _best(cands: list[Candidate], planned: dict[object, int]) -> tuple[Candidate | None, float]:
    """The candidate whose next draft token is worth most, and that worth."""
    best, worth = None, 0.0
    for c in cands:
        j = planned.get(c.key, 0)
        if j < c.draft_len and c.rate ** (j + 1) > worth:
            best, worth = c, c.rate ** (j + 1)
    return best, worth


def verify_draft(draft: tuple[int, ...], draw: Callable[[int], Sampled]) -> list[Sampled]:
    """Draw the target's token at each row of a drafted item, in order, while it agrees with
    the draft: `draw(j)` samples row j (the row after the j-th draft token; row 0 follows the
    sequence's last token). Returns the kept tokens: the agreeing draft tokens and the first
    disagreeing draw (or the draw after the whole draft); a draw that fails, ends generation
    or completes a grammar ends them."""
    kept = []
    for j in range(len(draft) + 1):
        s = draw(j)
        kept.append(s)
        if s.error or s.is_eog or s.is_last or j == len(draft) or s.token != draft[j]:
            break
    return kept


def num_accepted(draft: tuple[int, ...], kept: list[Sampled]) -> int:
    """How many of the draft's tokens the target's draws agreed with."""
    n = 0
    for d, s in zip(draft, kept, strict=False):
        if s.error or s.token != d:
            break
        n += 1
    return n
