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
without drafts does, so a seeded request gives the same reply with speculation on and off
where the numerics are the same (the fake runner's). On llama.cpp a drafted step's rows differ
in the last bits, and which steps draft depends on what the server has learned, so a seeded
sampled request does not draft unless `[scheduler] draft_seeded` (config.py).

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

NGRAMS = (16, 8, 4, 2)  # lookup lengths, longest first: the longest agreement wins
START_CAP = 8  # draft tokens a sequence may carry at first, and after a draft that failed
PRIOR = 0.5  # acceptance rate assumed before anyone has drafted
PRIOR_RANGE = (0.3, 0.9)  # what everyone's recent drafts may make a new sequence assume
EVERYONE_DECAY = 0.95  # per drafted row: how fast the server-wide rate forgets
PRIOR_WEIGHT = 2.0  # ... worth this many observed draft tokens
CALIBRATION_WEIGHT = 2.0  # tokens: a calibration of 1 until forecasts of more say otherwise
DECAY = 0.8  # per step with a draft: older outcomes fade
IDLE_DECAY = 0.9  # per step without one: the estimate drifts back to the prior
MAX_PROBE_WAIT = 64  # steps: the longest a sequence waits between probes
BACK_OFF_AFTER = 2  # drafted steps in a row that kept nothing: then it only probes
EVIDENCE_PER_TOKEN = 4  # an agreement counted up to this many times the draft's length
PREFILL_STRETCH = 2.0  # with a prompt's chunk in the step: the most drafts may stretch it


class NgramDrafter:
    """Prompt lookup over one sequence's tokens: the continuation of an earlier occurrence of
    its last n tokens (n in NGRAMS, longest first), and of the same user's earlier turns
    (`parent`: the drafter of the conversation's last reply).

    Indexed incrementally: each table maps an n-gram (its hash) to the position after its
    latest occurrence, for every n-gram whose continuation is known (that ends before the last
    token), so a lookup never finds the suffix itself. The longest n that matches wins, the
    latest occurrence of it on a tie: of a file's several versions in a conversation, the one
    whose text agrees furthest back. Tables are filled by `dict.update` over zipped slices
    (C speed: a 3,000-token prompt in a few milliseconds, on the engine thread); a hash that
    collides only makes a wrong draft, which verification rejects.

    A drafter made from a `parent` (a finished sequence of the same user whose tokens start as
    this one's do, `shared` of them) indexes only from there: the conversation is indexed once,
    turn by turn, and the parent's text past `shared` (the earlier reply as it was generated)
    is a draft source too."""

    __slots__ = (
        "_tables",
        "_indexed",
        "_tokens",
        "parent",
        "shared",
        "depth",
        "prompt_len",
        "evidence",
    )

    def __init__(self, parent: NgramDrafter | None = None, shared: int = 0) -> None:
        self._tables: dict[int, dict[int, int]] = {n: {} for n in NGRAMS}
        self.parent, self.shared = (parent, shared) if parent is not None else (None, 0)
        self.depth = parent.depth + 1 if parent is not None else 0
        # n-grams ending before this position are in the tables (the parent's, before shared)
        self._indexed = max(self.shared - 1, 0)
        self._tokens: list[int] = []
        self.prompt_len = 0  # its sequence's prompt (DraftHistory: what a next turn must pass)
        self.evidence = 0  # of the last proposal (propose)

    @property
    def tokens(self) -> list[int]:
        return self._tokens

    @property
    def size(self) -> int:
        """Positions indexed here and in the parents (what the history counts)."""
        own = max(self._indexed - max(self.shared - 1, 0), 0)
        return own + (self.parent.size if self.parent is not None else 0)

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest suffix.

        A suffix whose latest occurrence in this sequence is p tokens back, where the text
        before it agrees with the sequence's for p tokens or more (the suffix's own n included),
        shows a text repeating with period p over 2p tokens at least (a list's markup, a tiny
        model stuck in a loop): its continuation runs into the suffix itself, and the draft goes
        on copying what it copies (as LZ77 does), k tokens of the period, not p.

        `evidence`: for a suffix of the longest length found (16 tokens verbatim: no chance
        phrase), how many of the sequence's last tokens agree with the text before the
        occurrence (up to EVIDENCE_PER_TOKEN * k): a reply copying its prompt or looping, as
        good as drafts kept whole (`Candidate.forecast`); 0 for any other draft."""
        self.evidence = 0
        if k <= 0:
            return []
        self._tokens = tokens
        self._index(tokens)
        end = len(tokens)
        for n in NGRAMS:
            if end < n:
                continue
            key = hash(tuple(tokens[end - n :]))
            drafter = self
            while drafter is not None:  # the latest text first: this turn, then the earlier
                at = drafter._tables[n].get(key)
                if at is None:
                    drafter = drafter.parent
                    continue
                if n == NGRAMS[0]:  # (the scans: only where their answer is used)
                    self.evidence = _agreement(tokens, drafter._tokens, at, k * EVIDENCE_PER_TOKEN)
                period = end - at
                if drafter is self and period < k and _repeats(tokens, at, n, self.evidence):
                    return [tokens[at + j % period] for j in range(k)]
                return drafter._tokens[at : at + k]
        return []

    def _index(self, tokens: list[int]) -> None:
        last = len(tokens) - 1  # the n-gram ending at i continues at i + 1; i < last
        if last <= self._indexed:
            return
        for n, table in self._tables.items():
            first = max(self._indexed + 1 - n, 0)  # n-grams starting here end at >= _indexed
            count = last - n + 1 - first  # ... and those starting up to last - n end < last
            if count <= 0:
                continue
            columns = [tokens[first + j : first + j + count] for j in range(n)]
            keys = map(hash, zip(*columns, strict=True))
            table.update(zip(keys, range(first + n, first + n + count), strict=True))
        self._indexed = last


def _agreement(tokens: list[int], source: list[int], at: int, most: int) -> int:
    """How many of the last tokens (up to `most`) equal those before `source[at]`."""
    end, run = len(tokens), 0
    while run < most and run < at and tokens[end - run - 1] == source[at - run - 1]:
        run += 1
    return run


def _repeats(tokens: list[int], at: int, n: int, evidence: int) -> bool:
    """Whether the text before `at` agrees with the sequence's end for a whole period."""
    period = len(tokens) - at
    return max(n, evidence) >= period or _agreement(tokens, tokens, at, period) >= period


class DraftStats:
    """A sequence's draft acceptance rate, learned from its own verified drafts.

    A sequence whose rate does not pay for a row would never draft, and so never learn that
    its text has become a repetition: it *probes* instead, one draft token now and then, at
    intervals that double after every drafted step that kept nothing (up to MAX_PROBE_WAIT
    steps) and halve after one that kept something. After BACK_OFF_AFTER drafted steps in a row
    that kept nothing it only probes, whatever its rate says, until a probe is kept: the rate's
    prior keeps it from reaching 0, and on a device where a row costs little next to a step it
    would otherwise go on drafting.

    How long a draft it may carry (`cap`) grows while its drafts are kept whole: it doubles
    after a draft of half its cap or more that was kept entirely, up to `max_cap`, and falls back at
    once after one that was not (to what that draft kept, START_CAP at least). A reply copying
    a long stretch drafts tens of tokens a step; one that copies in short runs, a few."""

    __slots__ = (
        "accepted",
        "tried",
        "probe_wait",
        "idle",
        "failures",
        "cap",
        "max_cap",
        "streak",
        "prior",
        "forecast",
        "kept",
        "pending",
        "probing",
    )

    def __init__(self, max_cap: int = START_CAP, prior: float = PRIOR) -> None:
        self.prior = prior  # the rate assumed before its own drafts say (Everyone.prior)
        self.max_cap = max(max_cap, 1)
        self.cap = min(START_CAP, self.max_cap)  # draft tokens it may carry next
        self.accepted = 0.0  # decayed counts of draft tokens accepted / judged
        self.tried = 0.0
        self.probe_wait = 1  # steps without a draft before the next probe
        self.idle = 0  # steps since its last draft
        self.failures = 0  # drafted steps in a row that kept no draft token
        self.streak = 0  # draft tokens kept by its drafts in a row that were all kept whole
        # decayed sums of the tokens its drafts were forecast to keep and kept (`calibration`)
        self.forecast = 0.0
        self.kept = 0.0
        self.pending = 0.0  # the forecast of the draft being verified
        self.probing = False  # ... and whether it is a probe

    @property
    def may_probe(self) -> bool:
        return self.idle >= self.probe_wait

    @property
    def backing_off(self) -> bool:
        """Its drafts keep failing: it only probes."""
        return self.failures >= BACK_OFF_AFTER

    @property
    def calibration(self) -> float:
        """What its drafts kept over what they were forecast to keep (at most 1): a reply whose
        acceptance comes in bursts (short drafts kept whole, then refused) makes the run's
        forecast too hopeful, and on a full batch, where a row must nearly surely pay, that
        turned drafts into a loss (16 users' unrelated chats: 0.83x without it)."""
        return min(1.0, (self.kept + CALIBRATION_WEIGHT) / (self.forecast + CALIBRATION_WEIGHT))

    @property
    def rate(self) -> float:
        """The chance that a draft token is accepted, given that the ones before it were."""
        return (self.accepted + self.prior * PRIOR_WEIGHT) / (self.tried + PRIOR_WEIGHT)

    def update(self, num_drafted: int, num_accepted: int, probe: bool = False) -> None:
        """One step's outcome: a draft of `num_drafted` tokens of which the first
        `num_accepted` were kept (the one after them, if any, was judged and rejected);
        `probe`: it was a probe (its rate did not pay for the row): kept or not, the next
        probe waits twice as long; only a planned draft that is kept shortens the wait (a
        probe kept that still leaves its drafts short of paying found nothing to act on)."""
        if not num_drafted:
            self.accepted *= IDLE_DECAY
            self.tried *= IDLE_DECAY
            self.idle += 1
            return
        self.idle = 0
        start = min(START_CAP, self.max_cap)
        self.streak = self.streak + num_accepted if num_accepted == num_drafted else 0
        if num_accepted == num_drafted:
            if 2 * num_drafted >= self.cap:  # (the planner may have given it a little less)
                self.cap = min(self.cap * 2, self.max_cap)
        else:
            self.cap = min(max(start, num_accepted), self.max_cap)
        if num_accepted and probe:
            self.probe_wait = min(MAX_PROBE_WAIT, self.probe_wait * 2)
            self.failures = 0
        elif num_accepted:
            self.probe_wait = max(1, self.probe_wait // 2)
            self.failures = 0
        else:
            self.probe_wait = min(MAX_PROBE_WAIT, self.probe_wait * 2)
            self.failures += 1
        judged = num_accepted + (num_accepted < num_drafted)
        self.forecast = self.forecast * DECAY + self.pending
        self.kept = self.kept * DECAY + num_accepted
        self.pending = 0.0
        self.accepted = self.accepted * DECAY + num_accepted
        self.tried = self.tried * DECAY + judged


class Everyone:
    """The acceptance rate of everyone's recent drafts: what a new sequence assumes before its
    own drafts say (within PRIOR_RANGE). Where replies copy their prompts, a new one starts
    with a full draft instead of a few steps of single-token probes; where drafts fail, it
    starts cautious. Its own rate takes over after a few drafted steps (PRIOR_WEIGHT), so a
    user whose drafts always fail costs the next newcomer one short failed draft at most."""

    def __init__(self) -> None:
        self.accepted = 0.0
        self.judged = 0.0

    @property
    def prior(self) -> float:
        rate = (self.accepted + PRIOR * PRIOR_WEIGHT) / (self.judged + PRIOR_WEIGHT)
        return min(max(rate, PRIOR_RANGE[0]), PRIOR_RANGE[1])

    def update(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted:
            self.accepted = self.accepted * EVERYONE_DECAY + num_accepted
            self.judged = self.judged * EVERYONE_DECAY + num_accepted + (num_accepted < num_drafted)


class Candidate(NamedTuple):
    """A sequence that could carry a draft this step (its decode row is in the batch)."""

    key: object  # returned with its planned length
    user: str
    rate: float  # DraftStats.rate
    draft_len: int  # tokens the drafter proposed (the most it may carry)
    probe: bool = False  # DraftStats.may_probe: one row even where the rate does not pay
    probe_only: bool = False  # DraftStats.backing_off: no row but a probe
    streak: int = 0  # DraftStats.streak: tokens kept by its last drafts, all kept whole
    calibration: float = 1.0  # DraftStats.calibration: what its drafts kept over the forecast

    def forecast(self, j: int) -> float:
        """The chance that its j-th draft token (from 1) is reached and accepted: rate^j, or
        while its drafts are kept whole, what that run predicts if higher. A run of n tokens
        kept and none refused, with the per-token chance unknown (a uniform prior), predicts
        j more with probability (n + 1) / (n + j + 1): a reply copying a long stretch drafts
        about twice what it has kept so far, not what rate^j allows, and its first refusal
        ends the run."""
        run = (self.streak + 1) / (self.streak + j + 1) if self.streak else 0.0
        return max(self.rate**j, run)

    def worth(self, j: int) -> float:
        """The forecast, scaled by how its past forecasts fared (never up)."""
        return self.calibration * self.forecast(j)

    def forecast_tokens(self, n: int) -> float:
        """The tokens a draft of n is forecast to keep."""
        return sum(self.forecast(j) for j in range(1, n + 1))


class DraftCosts(NamedTuple):
    """What the step costs, from the step cost model."""

    step_s: float  # the step as scheduled, without drafts
    num_tokens: int  # tokens it already produces (its decode rows)
    row_s: float  # one draft row
    limit_s: float  # the ITL target: the step may not be predicted longer with its drafts...
    # ... than this many times, where every decode row of the step carries a draft expected to
    # give it that many tokens (each stream still gets a token per limit_s): inf without a
    # prompt's chunk in the step, PREFILL_STRETCH with one (its TTFT waits for the step)
    max_stretch: float = 1.0
    # the step's predicted time with n draft rows (the cost model's, which prices a batch's
    # prompt tokens by its size); None: step_s + n * row_s
    step_with: Callable[[int], float] | None = None

    def with_rows(self, n: int) -> float:
        return self.step_with(n) if self.step_with else self.step_s + n * self.row_s


def plan_drafts(
    candidates: list[Candidate],
    costs: DraftCosts,
    max_rows: int,
    lone_probes: int = 1,
    probes: set | None = None,
) -> dict[object, int]:
    """How many draft tokens each candidate carries (only those with at least one).

    Rows are dealt one at a time, round-robin over users in the candidates' order; a user's
    row goes to its sequence whose next draft token is most likely accepted. A row is added
    only while its expected tokens (`Candidate.worth` of a sequence's j-th) exceed what the
    same time buys without drafts (row_s * tokens / step_s), and while the step stays within
    limit_s, stretched as far as every decode row's expected tokens (at most max_stretch): a
    stream beside long drafts without one of its own keeps the ITL target; streams that all
    draft get their tokens in fewer, longer steps. The rows together must also pay the step's
    fixed price for having any (`step_with`), or none goes in; then probes (`lone_probes` at
    most in a step without other draft rows; their keys go into `probes`, if given).
    """
    if max_rows <= 0 or costs.row_s <= 0 or not candidates:
        return {}
    users: dict[str, list[Candidate]] = {}
    for c in candidates:
        if c.draft_len > 0 and not c.probe_only:
            users.setdefault(c.user, []).append(c)
    plan = _Plan(costs, [c.key for cs in users.values() for c in cs])
    plan.deal(users, max_rows)
    if plan.rows and not plan.pays_as_a_whole():
        plan = _Plan(costs, plan.expected)
    probed = plan.probe(candidates, max_rows, lone_probes)
    if probes is not None:
        probes.update(probed)
    return plan.planned


class _Plan:
    """A step's draft rows as they are dealt (`plan_drafts`)."""

    def __init__(self, costs: DraftCosts, keys) -> None:
        self.costs = costs
        self.planned: dict[object, int] = {}
        # every drafting decode row's expected tokens this step (1 + its draft's worth)
        self.expected = dict.fromkeys(keys, 1.0)
        # a decode row that cannot draft keeps the flat target
        self.can_stretch = costs.max_stretch > 1 and len(self.expected) >= costs.num_tokens
        self.rows = 0
        self.step_s, self.tokens = max(costs.step_s, 1e-9), float(max(costs.num_tokens, 1))

    def limit(self, key=None, more: float = 0.0) -> float:  # (a step exactly at it is within)
        costs = self.costs
        if not self.can_stretch:
            return costs.limit_s + 1e-9
        least = min(v + more if k == key else v for k, v in self.expected.items())
        return costs.limit_s * min(least, costs.max_stretch) + 1e-9

    def deal(self, users: dict[str, list[Candidate]], max_rows: int) -> None:
        costs = self.costs
        while users and self.rows < max_rows:
            for user in list(users):
                best, worth = _best(users[user], self.planned)
                if best is None:
                    del users[user]
                    continue
                pays = worth * self.step_s > costs.row_s * self.tokens
                if not pays or costs.with_rows(self.rows + 1) > self.limit(best.key, worth):
                    del users[user]  # its best row does not pay: none of its others would
                    continue
                self.add(best.key, worth)
                if self.rows >= max_rows:
                    break

    def add(self, key, worth: float) -> None:
        self.planned[key] = self.planned.get(key, 0) + 1
        if key in self.expected:
            self.expected[key] += worth
        self.rows += 1
        self.step_s += self.costs.row_s
        self.tokens += worth

    def pays_as_a_whole(self) -> bool:
        """More tokens per second of step with the rows than without, their fixed price paid."""
        costs = self.costs
        base_s, base_tokens = max(costs.step_s, 1e-9), float(max(costs.num_tokens, 1))
        return self.tokens * base_s > base_tokens * costs.with_rows(self.rows)

    def probe(self, candidates: list[Candidate], max_rows: int, lone: int) -> list:
        """One row each for the probes, in the time and rows left: where the step already
        carries draft rows (their fixed price is paid), every probe; where it carries none,
        `lone` probes at most (a probe alone pays the whole fixed price: on this CPU 10-13 ms
        beside a 12-60 ms step), and none where a row costs more than the step's time per
        token already: no draft could pay there, however right."""
        allowed = max_rows if self.rows else lone
        costs, probed = self.costs, []
        if costs.row_s * max(costs.num_tokens, 1) >= costs.step_s:  # a sure token would not pay
            allowed = 0  # for its row (a full batch on a CPU): nothing for a probe to find
        for c in candidates:
            if c.probe and c.draft_len and c.key not in self.planned and self.rows < max_rows:
                if allowed <= 0 or self.costs.with_rows(self.rows + 1) > self.limit():
                    break
                self.add(c.key, 0.0)
                probed.append(c.key)
                allowed -= 1
        return probed


def _best(cands: list[Candidate], planned: dict[object, int]) -> tuple[Candidate | None, float]:
    """The candidate whose next draft token is worth most, and that worth."""
    best, worth = None, 0.0
    for c in cands:
        j = planned.get(c.key, 0)
        if j < c.draft_len and c.worth(j + 1) > worth:
            best, worth = c, c.worth(j + 1)
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
