"""Embedding requests in the engine: what one is, the checks on it, and each step's packing.

An embedding request is a user's list of inputs (token lists) to be turned into one pooled,
normalised vector each. It queues per user as a chat does; each step `EmbeddingQueue.plan`
packs whole inputs of the waiting and running requests into the step's embedding batch (the
runner decodes it on its embedding context, after the chat batch, in the same step):
- round robin over users, one input at a time, starting one user later every step: a user with
  thousands of inputs takes no more of a step than another with one;
- within the step's budget, `schedule_embeddings`: the same step time the prompt budget of
  prefill chunks comes from (what the ITL target leaves beside the running streams' decodes,
  localserve.engine.budget), shared with prefill chunks, at the cost model's own price of an
  embedding token;
- never more than the embedding context's n_batch tokens (`max_tokens`) or n_seq_max inputs
  (`max_inputs`) in a step: llama.cpp aborts the process past n_batch;
- an input is never split (a pooled vector needs all its tokens in one decode): one larger
  than the budget waits while its user gains credit, the budget of every step it waited, and
  goes (first, alone if need be) once the credit covers it. So a long input costs the streams
  one longer step per so many steps, never a stall, and nobody's input waits forever.
A request's inputs may spread over several steps; its Embedded and Done go out once all its
vectors are in.

Tested in tests/unit/engine/test_embedding.py and tests/unit/engine/test_embedding_engine.py.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from localserve.protocol.snapshot import ModelInfo


def check_embedding(request_id: str, inputs: list[list[int]], info: ModelInfo) -> None:
    """Raise ValueError for inputs the engine does not take: none, an empty one, too many, one
    too long, a token id outside the vocabulary."""
    if not inputs:
        raise ValueError("embedding request without inputs")
    if len(inputs) > info.max_embed_inputs:
        raise ValueError(
            f"too_many_inputs: {len(inputs)} inputs; the model takes {info.max_embed_inputs}"
        )
    for i, tokens in enumerate(inputs):
        if not tokens:
            raise ValueError(f"input {i} is empty")
        if len(tokens) > info.max_embed_tokens:
            raise ValueError(
                f"too_long: input {i} has {len(tokens)} tokens; "
                f"the model embeds at most {info.max_embed_tokens}"
            )
        if min(tokens) < 0 or max(tokens) >= info.n_vocab:
            raise ValueError(f"input {i} has a token id outside [0, {info.n_vocab})")


def check_chat(info: ModelInfo) -> None:
    """Raise ValueError (embedding_only) for a chat to a model that serves embeddings only."""
    if info.is_embedding_only:
        raise ValueError(
            f"embedding_only: model {info.model} is an embedding model; it answers embeddings, "
            "not chats or completions"
        )


@dataclass(eq=False)
class EmbeddingRequest:
    """One embedding request in the engine. Owned by the engine thread once added."""

    request_id: str
    client_id: str
    user: str
    inputs: list[list[int]]
    arrival_time: float
    num_scheduled: int = 0  # inputs handed to a step (in order)
    num_done: int = 0  # inputs whose vector is in
    num_tokens_done: int = 0
    vectors: list = field(default_factory=list)  # one per input once done (numpy rows)
    first_scheduled_time: float | None = None
    first_vector_time: float | None = None
    finished_time: float | None = None
    finish_reason: str = ""  # "" while in flight; stop | cancelled | error
    error: str = ""
    is_cancelled: bool = False

    def __post_init__(self) -> None:
        self.vectors = [None] * len(self.inputs)

    @property
    def num_tokens(self) -> int:
        return sum(map(len, self.inputs))

    @property
    def is_running(self) -> bool:
        """Some of its inputs were computed or handed to a step."""
        return self.num_scheduled > 0

    @property
    def is_finished(self) -> bool:
        return bool(self.finish_reason)

    @property
    def has_pending(self) -> bool:
        return self.num_scheduled < len(self.inputs)

    def finish(self, reason: str, now: float, error: str = "") -> None:
        if not self.is_finished:
            self.finish_reason, self.finished_time, self.error = reason, now, error

    def timings(self) -> dict[str, float | None]:
        """queue_ms (arrival to its first input's step), ttft_ms (arrival to its first vector:
        the part of the answer that exists first), itl_ms (None: no tokens stream), e2e_ms."""

        def ms(start: float | None, end: float | None) -> float | None:
            return None if start is None or end is None else (end - start) * 1e3

        t0 = self.arrival_time
        return {
            "queue_ms": ms(t0, self.first_scheduled_time),
            "ttft_ms": ms(t0, self.first_vector_time),
            "itl_ms": None,
            "e2e_ms": ms(t0, self.finished_time),
        }


class EmbedItem(NamedTuple):
    """One input in a step's embedding batch."""

    request: EmbeddingRequest
    index: int  # the input's place in its request
    num_tokens: int


class EmbeddingQueue:
    """The embedding requests of the engine, per user, and each step's packing of their inputs."""

    def __init__(self, max_tokens: int, max_inputs: int) -> None:
        """`max_tokens`, `max_inputs`: the most one step's embedding batch may carry."""
        self.max_tokens = max_tokens
        self.max_inputs = max_inputs
        self.queues: dict[str, deque[EmbeddingRequest]] = {}  # per user, arrival order
        self._users: deque[str] = deque()  # round-robin order of users with pending inputs
        self._credit: dict[str, float] = {}  # tokens a user's too-long head input has waited for
        self._cancelled: list[EmbeddingRequest] = []

    # --- requests in and out ---------------------------------------------------------------

    def add(self, request: EmbeddingRequest) -> None:
        if request.user not in self.queues:
            self.queues[request.user] = deque()
            self._users.append(request.user)
        self.queues[request.user].append(request)

    def cancel(self, request: EmbeddingRequest) -> None:
        """Mark for removal; takes effect at the next `reap`."""
        if not request.is_finished and not request.is_cancelled:
            request.is_cancelled = True
            self._cancelled.append(request)

    def reap(self, now: float) -> list[EmbeddingRequest]:
        """The cancelled requests, out of the queue and finished."""
        reaped, self._cancelled = self._cancelled, []
        for request in reaped:
            self._remove(request)
            request.finish("cancelled", now)
        return reaped

    def fail(self, requests: list[EmbeddingRequest], message: str, now: float) -> None:
        """End requests with an error (their decode failed)."""
        for request in requests:
            self._remove(request)
            request.finish("error", now, message)

    def _remove(self, request: EmbeddingRequest) -> None:
        queue = self.queues.get(request.user)
        if queue and request in queue:
            queue.remove(request)
            if not queue:
                self._drop_user(request.user)

    def _drop_user(self, user: str) -> None:
        del self.queues[user]
        self._users.remove(user)
        self._credit.pop(user, None)

    @property
    def has_work(self) -> bool:
        return bool(self.queues or self._cancelled)

    @property
    def requests(self) -> list[EmbeddingRequest]:
        """Every queued request, users in round-robin order."""
        return [r for user in self._users for r in self.queues[user]]

    # --- one step --------------------------------------------------------------------------

    def plan(
        self, budget: float, now: float = 0.0, gain: float | None = None, overhead: float = 0.0
    ) -> list[EmbedItem]:
        """Whole inputs for this step within `budget` tokens (and the step limits), round robin
        over users from the one after last step's first; a user whose next input has waited
        long enough goes first, even past the budget: its credit (`gain` tokens' worth of step
        time for every step it waited; default `budget`) covers the input and the decode's fixed
        part (`overhead`, in tokens)."""
        gain = budget if gain is None else gain
        items: list[EmbedItem] = []
        num_tokens = 0
        heads = {u: head for u in self._users if (head := self._head(u)) is not None}
        order = list(heads)
        due = [u for u in order if self._is_due(u, len(heads[u][1]), gain, overhead)]
        if due and len(heads[due[0]][1]) > budget:  # a long input's turn: it goes first
            order.remove(due[0])
            order.insert(0, due[0])
        blocked = set()
        while len(items) < self.max_inputs:
            took = False
            for user in order:
                if user in blocked or len(items) >= self.max_inputs:
                    continue
                request, tokens = heads[user]
                n = len(tokens)
                first_past_budget = not items and self._is_due(user, n, gain, overhead)
                if num_tokens + n > self.max_tokens or (
                    num_tokens + n > budget and not first_past_budget
                ):
                    blocked.add(user)
                    continue
                items.append(EmbedItem(request, request.num_scheduled, n))
                if request.first_scheduled_time is None:
                    request.first_scheduled_time = now
                request.num_scheduled += 1
                num_tokens += n
                took = True
                self._credit.pop(user, None)
                nxt = self._head(user)
                if nxt is None:
                    blocked.add(user)
                else:
                    heads[user] = nxt
            if not took:
                break
        for user in blocked:  # waited for the budget: credit for the next steps
            if user in heads and user not in {i.request.user for i in items}:
                self._credit[user] = self._credit.get(user, 0) + gain
        if self._users:
            self._users.rotate(-1)  # the next step starts with the next user
        return items

    def _is_due(self, user: str, num_tokens: int, gain: float, overhead: float) -> bool:
        return num_tokens + overhead <= self._credit.get(user, 0) + gain

    def _head(self, user: str) -> tuple[EmbeddingRequest, list[int]] | None:
        """A user's next input to schedule (of its first request with one pending), or None
        (its requests wait only for their vectors)."""
        for request in self.queues[user]:
            if request.has_pending:
                return request, request.inputs[request.num_scheduled]
        return None

    def done(self, items: list[EmbedItem], vectors, now: float) -> list[EmbeddingRequest]:
        """A step's vectors in: returns the requests now complete (out of the queue)."""
        complete = []
        for item, vector in zip(items, vectors, strict=True):
            request = item.request
            if request.is_finished:  # cancelled meanwhile (cannot happen within a step)
                continue
            if request.first_vector_time is None:
                request.first_vector_time = now
            request.vectors[item.index] = vector
            request.num_done += 1
            request.num_tokens_done += item.num_tokens
            if request.num_done == len(request.inputs):
                self._remove(request)
                request.finish("stop", now)
                complete.append(request)
        return complete


EMBED_FLOOR_SHARE = 0.5  # of the ITL target: the least step time embeddings get beside streams
UNBOUND_ITL_FACTOR = 2.0  # of the ITL target: the most step time they get when no chat runs


def schedule_embeddings(queue: EmbeddingQueue, batch, cost, config, has_prefills: bool, now):
    """The step's embedding inputs into `batch`; returns the prompt tokens' worth of the
    step's budget they took (the prefill chunks get the rest).

    While chats run (continuous policy: streams decoding, or a prompt being prefilled, a new
    reply's first token waiting on it) the inputs get the step time the ITL target leaves
    beside the decodes (half of it beside prompts: they share it), at least EMBED_FLOOR_SHARE
    of the target, at the cost model's own price of an embedding token (it is several prompt
    tokens' on a large vocabulary: the LM head runs for every token), re-learned from every
    embedding step. With no chat running, UNBOUND_ITL_FACTOR × the ITL target, charged
    nothing: a chat that arrives meanwhile waits for that step only, and its own prefill step
    is a chat's. (It was a fifth of the TTFT target, 1 s, also beside a new reply's prefill:
    each reply of a stream beside an embedding flood began a second or two late.)"""
    if not (batch.num_decode_tokens or has_prefills) or config.policy != "continuous":
        budget_s, bound = UNBOUND_ITL_FACTOR * config.itl_target_ms / 1e3, False
    else:
        target = config.itl_target_ms / 1e3
        spare = target - cost.predict(batch.num_decode_tokens, 0)
        spare_s = max(spare / 2 if has_prefills else spare, EMBED_FLOOR_SHARE * target)
        budget_s, bound = spare_s, True
    # in tokens: what the decode's fixed part leaves, and that part in tokens (credit pays it)
    e, fixed = cost.embed_token_s, cost.embed_fixed_s
    budget, overhead = max(0.0, (budget_s - fixed) / e), fixed / e
    batch.embeds = queue.plan(budget, now, gain=budget_s / e, overhead=overhead)
    batch.num_embed_tokens = sum(item.num_tokens for item in batch.embeds)
    if not bound:
        return 0
    return math.ceil(cost.embed_s(batch.num_embed_tokens) / cost.prefill_token_s)
