"""How long each waiting request will wait: the scheduler's state played forward.

The prediction is the scheduler's own rules run on a copy of its state, not an average of past
waits. Each running sequence still has its prompt's rest to prefill and `ReplyLengths.remaining`
tokens to generate (what replies of its user, else of everyone, have been: the mean of the
recent lengths longer than what it has, never past its max_tokens or the context). Steps cost what
the step cost model (budget.py) predicts for their rows; prompts advance by the step's prefill
budget (the ITL target's while anyone decodes). A waiting sequence enters by the scheduler's own
waiting line (waiting_line.py, on a copy of it: its order, the per-user cap, slots, the static
policy) when its prompt fits in the free cells above the watermark; the cells of a sequence that
ends are free again. The play jumps from event to event (an end, a
prompt's last chunk), so it costs a few thousand operations for a full server.

What it cannot know: replies that end sooner or later than their users' usual ones, requests that
arrive meanwhile and pass by fairness (a new user's turn comes before a waiting user's second
request), cancellations, a machine that slows down. Its error is measured (metrics.py) and shown.

Pure Python, no I/O; tested in tests/unit/engine/test_waits.py.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from localserve.config import SchedulerConfig
from localserve.engine.budget import StepCostModel
from localserve.engine.events import WaitPredicted
from localserve.engine.kv import KVPool
from localserve.engine.sequence import FinishReason, Sequence, Status
from localserve.engine.waiting_line import Entry, WaitingLine

NUM_LENGTHS = 256  # reply lengths remembered, all users together
NUM_USER_LENGTHS = 32  # and per user
MIN_USER_LENGTHS = 4  # a user's own lengths are used from this many on
PRIOR_REPLY_TOKENS = 200  # before any reply finished: a chat reply's usual length
MAX_EVENTS = 20_000  # the play stops here (None for those not admitted by then)
INTERVAL_S = 0.5  # predictions at most this often: each one plays the whole queue forward
# a waiting request hears again when its place changed or its predicted entry moved by this
# much (seconds, or this share of what is left of its wait): clients count down in between
MIN_SHIFT_S = 1.0
MIN_SHIFT_SHARE = 0.2
NEWCOMER = "\0newcomer"  # the hypothetical new user of "a newcomer would wait about N s"
PRIOR_PROMPT_TOKENS = 100  # before any request: a chat turn's usual prompt


class ReplyLengths:
    """The lengths (output tokens) of recently finished replies, in all and per user."""

    def __init__(self) -> None:
        self._all: deque[int] = deque(maxlen=NUM_LENGTHS)
        self._per_user: dict[str, deque[int]] = {}
        self._prompts: deque[int] = deque(maxlen=NUM_LENGTHS)

    @property
    def typical_prompt(self) -> int:
        """The median prompt of the recent requests (a newcomer's, for its predicted wait)."""
        if not self._prompts:
            return PRIOR_PROMPT_TOKENS
        return sorted(self._prompts)[len(self._prompts) // 2]

    def add(self, user: str, num_tokens: int, num_prompt_tokens: int = 0) -> None:
        self._all.append(num_tokens)
        if num_prompt_tokens:
            self._prompts.append(num_prompt_tokens)
        own = self._per_user.setdefault(user, deque(maxlen=NUM_USER_LENGTHS))
        own.append(num_tokens)
        if len(self._per_user) > NUM_LENGTHS:  # bounded: forget the user heard from longest ago
            del self._per_user[next(iter(self._per_user))]

    def remaining(self, user: str, generated: int, limit: int) -> int:
        """Tokens a reply that has `generated` tokens will still generate, at most `limit`."""
        if limit <= 0:
            return 0
        own = self._per_user.get(user, ())
        lengths = own if len(own) >= MIN_USER_LENGTHS else self._all
        longer = [n - generated for n in lengths if n > generated]
        if longer:
            guess = sum(longer) / len(longer)
        elif lengths:  # longer than any seen: it may end any time; a quarter more
            guess = generated / 4 + 1
        else:
            guess = max(PRIOR_REPLY_TOKENS - generated, generated / 4 + 1)
        return max(1, min(limit, math.ceil(guess)))


@dataclass
class SchedulerBounds:
    """The scheduler's bounds that decide when a waiting sequence may enter."""

    max_num_seqs: int
    max_num_batched_tokens: int
    num_cells: int
    num_watermark_cells: int
    itl_target_s: float
    min_prefill_tokens: int
    static: bool = False  # the static policy: admits only when nothing runs


def bounds(
    config: SchedulerConfig, kv: KVPool, max_num_seqs: int, max_num_batched_tokens: int
) -> SchedulerBounds:
    """A scheduler's bounds (scheduler.py reads the same settings)."""
    return SchedulerBounds(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        num_cells=kv.num_cells,
        num_watermark_cells=kv.num_watermark_cells,
        itl_target_s=config.itl_target_ms / 1e3,
        min_prefill_tokens=config.min_prefill_tokens,
        static=config.policy == "static",
    )


@dataclass
class _Sim:
    """One sequence in the play: its user, prompt still to prefill, tokens still to generate,
    cells it holds."""

    request_id: str
    user: str
    prefill: int
    decode: int
    cells: int


@dataclass
class Prediction:
    """A waiting request's place in the order it would be let in (1 = next) and about how many
    seconds from now it enters (None: not within what the play could see)."""

    position: int
    wait_s: float | None


@dataclass
class _Play:
    limits: SchedulerBounds
    cost: StepCostModel
    running: list[_Sim]
    free_cells: int
    line: WaitingLine[_Sim]  # a copy of the scheduler's
    now: float = 0.0
    entered: dict[str, float] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)

    def admit(self) -> None:
        """The waiting line's admission, its heads' cells counted here."""
        lim = self.limits
        self.line.admit(self.running, lim.max_num_seqs, lim.static, self.fits)

    def fits(self, seq: _Sim, anyone_running: bool) -> Entry:
        watermark = self.limits.num_watermark_cells if anyone_running else 0
        if seq.cells + watermark > self.free_cells:
            if anyone_running:
                return Entry.WAIT  # waits for cells to free
            self.free_cells = seq.cells  # alone it is admitted (or refused) at once
        self.free_cells -= seq.cells
        self.entered[seq.request_id] = self.now
        self.order.append(seq.request_id)
        return Entry.IN

    def advance(self) -> None:
        """Up to the next event: a prompt's last chunk, or the end of the shortest reply."""
        decoders = [s for s in self.running if not s.prefill]
        prefilling = [s for s in self.running if s.prefill]
        first = min(prefilling, key=lambda s: s.prefill, default=None)
        budget = max(self.prefill_budget(len(decoders)), 1) if first is not None else 0
        if first is not None and first.prefill > budget:
            # the shortest prompt takes each step's whole budget (the scheduler gives prefill
            # to the shortest first): those steps are alike, so they are played at once
            steps = first.prefill // budget
            if decoders:
                steps = min(steps, min(s.decode for s in decoders))
            first.prefill -= steps * budget
            step_s = self.cost.predict(len(decoders), budget)
        elif first is not None:  # a step that ends a prompt: the budget shared in that order
            step_s = self.cost.predict(
                len(decoders), min(budget, sum(s.prefill for s in prefilling))
            )
            for s in sorted(prefilling, key=lambda s: s.prefill):
                n = min(s.prefill, budget)
                s.prefill -= n
                budget -= n
            steps = 1
        else:
            steps = min(s.decode for s in decoders)
            step_s = self.cost.predict(len(decoders), 0)
        for s in decoders:  # each token takes a cell
            s.decode -= steps
            s.cells += steps
        self.free_cells -= len(decoders) * steps
        self.now += steps * step_s
        for s in [s for s in decoders if s.decode <= 0]:
            self.running.remove(s)
            self.line.stopped(s.user)
            self.free_cells += s.cells

    def prefill_budget(self, num_decode: int) -> int:
        lim = self.limits
        ceiling = lim.max_num_batched_tokens - num_decode
        if not num_decode:
            return ceiling
        return self.cost.prefill_budget(
            num_decode, lim.itl_target_s, lim.min_prefill_tokens, ceiling
        )


def predict_waits(
    running: Iterable[Sequence],
    line: WaitingLine[Any],
    limits: SchedulerBounds,
    cost: StepCostModel,
    lengths: ReplyLengths,
    num_free_cells: int,
    newcomer: Sequence | None = None,
) -> dict[str, Prediction]:
    """Every waiting sequence's position and predicted wait, by request id; with `newcomer`,
    also that of a request arriving now at the end of the line."""
    play = _Play(
        limits,
        cost,
        running=[_sim(s, lengths) for s in running],
        free_cells=num_free_cells,
        line=line.copy(lambda s: _sim(s, lengths)),
    )
    if newcomer is not None:
        play.line.add(_sim(newcomer, lengths))
    waiting_ids = [s.request_id for s in play.line.requeued]
    waiting_ids += [s.request_id for q in play.line.queues.values() for s in q]
    for _ in range(MAX_EVENTS):
        play.admit()
        if not play.line or not play.running:
            break
        play.advance()
    ranked = play.order + [i for i in waiting_ids if i not in play.entered]
    return {
        request_id: Prediction(position, play.entered.get(request_id))
        for position, request_id in enumerate(ranked, 1)
    }


def _sim(seq: Sequence, lengths: ReplyLengths) -> _Sim:
    """A sequence as the play sees it. A waiting one holds no cells yet: `cells` is what its
    prompt needs (its reuse of a cached prefix is not known before it enters)."""
    p = seq.params
    limit = min(p.max_tokens - seq.num_output_tokens, seq.max_total_tokens - len(seq.tokens))
    decode = max(1, lengths.remaining(seq.user, seq.num_output_tokens, limit))
    if seq.status is Status.RUNNING:  # what it holds grows as it goes
        prefill = seq.num_remaining if seq.is_prefilling or not seq.num_computed else 0
        return _Sim(seq.request_id, seq.user, prefill, decode, seq.num_cells)
    return _Sim(seq.request_id, seq.user, len(seq.tokens), decode, len(seq.tokens))


class WaitForecast:
    """The engine's side of the predictions: made at most every INTERVAL_S while anyone waits,
    told to a waiting request (`WaitPredicted`) when its place changed or its predicted entry
    moved materially, and each sequence's first one kept on it (`wait_prediction`: when it
    was made and the wait it predicted) so that the error is measured when it enters."""

    def __init__(self) -> None:
        self.lengths = ReplyLengths()
        self._due = -math.inf
        self._told: dict[str, tuple[int, float | None]] = {}  # request id -> place, entry time

    def is_due(self, now: float) -> bool:
        return now >= self._due

    def announce(
        self, predictions: dict[str, Prediction], waiting: list[Sequence], now: float
    ) -> list[WaitPredicted]:
        """The events for this round's predictions of the `waiting` sequences."""
        self._due = now + INTERVAL_S
        events, told = [], {}
        for seq in waiting:
            p = predictions.get(seq.request_id)
            if p is None:
                continue
            if seq.wait_prediction is None and p.wait_s is not None:
                seq.wait_prediction = (now, p.wait_s)
            entry = None if p.wait_s is None else now + p.wait_s
            last = self._told.get(seq.request_id)
            if last is None or _moved(last, (p.position, entry), now):
                events.append(WaitPredicted(seq.request_id, p.position, p.wait_s))
                last = (p.position, entry)
            told[seq.request_id] = last
        self._told = told  # those no longer waiting are forgotten
        return events

    def finished(self, seq: Sequence) -> None:
        """A reply that ended by itself teaches its length (cancelled or failed ones do not)."""
        if seq.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
            self.lengths.add(seq.user, seq.num_output_tokens, seq.num_prompt_tokens)

    def entry_in(self, request_id: str, now: float) -> float | None:
        """The latest predicted wait of a waiting request, from now (None: none yet)."""
        entry = self._told.get(request_id, (0, None))[1]
        return None if entry is None else max(entry - now, 0.0)


def _moved(last: tuple[int, float | None], new: tuple[int, float | None], now: float) -> bool:
    (position, entry), (new_position, new_entry) = last, new
    if position != new_position or (entry is None) != (new_entry is None):
        return True
    if entry is None or new_entry is None:
        return False
    left = max(entry - now, 0.0)
    return abs(new_entry - entry) >= max(MIN_SHIFT_S, MIN_SHIFT_SHARE * left)
