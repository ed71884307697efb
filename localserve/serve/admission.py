"""Admission: who and what the server lets in, whichever front-end a chat came through.

Every chat, a websocket frame or an HTTP request, passes `Admission.submit` (through its
model's door, model_door.py): the server's state and the engine's, the usage record and the
daily quota (held while the reply runs: ops/quotas.py), the per-user and global bounds
(request_counts.py), the sampling values, its model loaded (model_waits.py), the prompt
builder's too-long check, then the engine. A chat the server will not take is a `Refusal`
(door.py) carrying the protocol's error code. An embedding request (`Admission.embed`) passes
the same checks, holds its inputs' tokens of the quota, and has its inputs tokenized and
bounded (embedding_inputs.py); a chat to an embedding-only model is a bad_request.

Admission also holds what every door shares: the config and the usage record (read at every
use: the server's current ones), the token checks (authentication.py), the people trusted
front-ends named, the structured-output compiler, and the requests in flight.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import msgspec

from localserve.chat.constraints import ConstraintCompiler
from localserve.config import ServerConfig
from localserve.engine.client import EngineUnavailable
from localserve.engine.events import Done, EventSink
from localserve.engine.sampling_params import SamplingParams, sampling_params
from localserve.ops.auth import Access
from localserve.ops.people import PeopleStore
from localserve.ops.quotas import QuotaExceeded
from localserve.ops.usage import Usage
from localserve.protocol.frames import SamplingFields
from localserve.serve.authentication import Authentication
from localserve.serve.door import (
    MAX_EMBED_INPUTS,
    RETRY_UNAVAILABLE_S,
    BuildPrompt,
    Embedding,
    ModelDescription,
    ModelOption,
    Refusal,
    Request,
    Submission,
)
from localserve.serve.embedding_inputs import (
    EmbedLimits,
    InputRefused,
    check_count,
    check_dimensions,
    fit_token_lists,
)
from localserve.serve.model_waits import ModelWaits
from localserve.serve.pool import LoadFailure, ModelPool, ModelSlot
from localserve.serve.prompt import PromptTooLong
from localserve.serve.request_counts import RequestCounts
from localserve.serve.trusted_proxies import People


class Admission:
    """The server's admission: the checks before a chat, its way to the engine, the requests
    in flight. `config` and `usage` are read at every use: the server's current ones."""

    def __init__(
        self,
        pool: ModelPool,
        config: Callable[[], ServerConfig],
        usage: Callable[[], Usage | None],
        access: Access,
        on_events: EventSink | None = None,
        people: PeopleStore | None = None,
    ) -> None:
        self.pool = pool
        # where a `done` admission makes itself goes (the server's router, as the engine's do);
        # None: straight to the request's sink, unrecorded
        self.on_events = on_events
        self._config = config
        self.access = access
        self._usage = usage
        self.authentication = Authentication(config().max_auth_failures_per_minute)
        self.people = People(people)  # named by trusted front-ends, kept in `people`
        self.constraints = ConstraintCompiler()  # structured output: schemas compiled, cached
        self.counts = RequestCounts()
        self.waits = ModelWaits(pool, config, lambda: self.counts.waiting)
        self.is_shutting_down = False
        self._numbers = itertools.count(1)  # connections and HTTP requests

    @property
    def config(self) -> ServerConfig:
        return self._config()

    @property
    def usage(self) -> Usage | None:
        """The record of finished requests and the quotas (the server's current one)."""
        return self._usage()

    @property
    def records_usage(self) -> bool:
        return self.usage is not None

    @property
    def requests(self) -> dict[str, Request]:
        """The requests in flight, by engine id."""
        return self.counts.requests

    def next_number(self) -> int:
        return next(self._numbers)

    # --- the models -----------------------------------------------------------------------------

    @property
    def model_names(self) -> list[str]:
        default = self.pool.default
        return [default, *(n for n in self.pool.names if n != default)]

    def describe_models(self) -> list[ModelDescription]:
        loading = self.counts.loading()  # requests waiting for their model to load, per model
        return [self.pool.slot(n).describe(loading.get(n, 0)) for n in self.model_names]

    async def model_choices(self) -> list[ModelOption]:
        described = self.describe_models()
        choices = [await self.pool.choice(self.pool.slot(m["name"])) for m in described]
        return [
            ModelOption(**m, **dataclasses.asdict(c))
            for m, c in zip(described, choices, strict=True)
        ]

    # --- every chat, websocket or HTTP ------------------------------------------------------------

    async def submit(self, submission: Submission, slot: ModelSlot) -> Request | None:
        """Check the limits and the sampling values, build the prompt, hand it to the engine
        of the model of `slot` (Frontdoor.submit).

        The submission's `response_format` is compiled off the loop into the request's
        constraint (a bad one is a bad_request naming the keyword). Its model is loaded here
        when it is not (the request waits, `loading`, and is refused when the load fails). A
        cancel while the model loads or the prompt is built stops it at once with a `done`
        "cancelled" (none when its sink closed: None).
        """
        s = submission
        self._admit(s.user, s.fields.max_tokens, slot)
        if problem := _chat_to_embedding_model(slot):  # known before its load: models.toml's kind
            raise problem
        constraint = s.constraint
        try:
            if s.response_format is not None and constraint is None:
                constraint = await self.constraints.response_format(s.response_format)
            params = sampling_params(s.fields, constraint=constraint)
        except ValueError as e:  # ConstraintError too
            raise Refusal("bad_request", str(e)) from None
        request = Request(s.engine_id, s.client_id, s.user, s.sink, model=slot.name)
        request.keep_alive_s, request.cancelled = s.keep_alive_s, s.cancelled or request.cancelled
        self._open(request)
        if self.usage is not None:  # a quota: the reply may use at most what is left of it
            request.hold = self.usage.quotas.hold(s.user, params.max_tokens)
        if request.hold is not None:  # its max_tokens held until the prompt's length is known
            params = msgspec.structs.replace(params, max_tokens=request.hold.tokens)
        try:
            if not await self._enqueue(request, params, s.fields, s.prompt):
                return None
        except Refusal:
            raise
        except (EngineUnavailable, LoadFailure, PromptTooLong, ValueError) as e:
            self.release(request)
            raise _refusal(e, slot) from None
        except BaseException:  # unexpected (or cancelled): the request must not stay counted
            self.release(request)
            raise
        return request

    async def _enqueue(
        self, request: Request, params: SamplingParams, fields: SamplingFields, prompt: BuildPrompt
    ) -> bool:
        """Build the prompt and hand the request to the engine; False when its sink closed
        meanwhile (it is released here: nothing was queued)."""
        slot = self.pool.slot(request.model)
        if (not slot.is_loaded or slot.yielding_to) and not request.cancelled.is_set():
            await self.waits.wait_for(request, slot)
        if request.cancelled.is_set():  # while its model loaded: no prompt to build
            return self._end_cancelled(request)
        if problem := _chat_to_embedding_model(slot):
            self.release(request)
            raise problem
        truncate = self.config.context_overflow == "truncate"
        built = await prompt(slot.prompts, params.max_tokens if truncate else None)
        request.num_dropped_messages = built.num_dropped_messages
        request.prompt_tail = built.tail
        if not fields.ignore_eos:  # the format's end of turn is an EOS in all but name
            params = msgspec.structs.replace(params, format_stop=built.stops)
        if built.strip_space:  # "Assistant: ..." (the transcript): the space is the format's
            params = msgspec.structs.replace(params, strip_space=True)
        if request.sink.is_closed or self.is_shutting_down:  # both may come while tokenizing
            self.release(request)
            if self.is_shutting_down:
                raise Refusal("shutting_down", "the server is shutting down")
            return False
        if request.cancelled.is_set():  # while its prompt was built
            return self._end_cancelled(request)
        if request.hold is not None:
            params = self._hold_prompt(request, params, len(built.tokens))
        if slot.engine is None:  # unloaded while the prompt was built (it cannot be: active)
            raise EngineUnavailable(f"model {slot.name} is not loaded")
        slot.engine.add_request(
            request.engine_id,
            built.tokens,
            params,
            user=request.user,
            system_tokens=built.system_tokens,
            system_is_global=built.is_default_system,
            client_id=request.client_id,
        )
        request.is_in_engine = True
        return True

    # --- every embedding request, whichever API ------------------------------------------------

    async def embed(self, embedding: Embedding, slot: ModelSlot) -> Request | None:
        """Check the limits and the inputs, tokenize them, hand them to the engine of the model
        of `slot` (Frontdoor.embed). As `submit`: its model loaded here when it is not, a
        cancel meanwhile ends it with a `done` "cancelled" (None when its sink closed)."""
        e = embedding
        self._admit(e.user, 0, slot)
        try:
            check_count(len(e.inputs), MAX_EMBED_INPUTS)
        except InputRefused as refused:
            raise Refusal(refused.code, refused.message) from None
        request = Request(e.engine_id, e.client_id, e.user, e.sink, model=slot.name)
        request.keep_alive_s, request.cancelled = e.keep_alive_s, e.cancelled or request.cancelled
        request.dimensions = e.dimensions
        self._open(request)
        if self.usage is not None:  # the inputs' tokens are held once they are counted
            request.hold = self.usage.quotas.hold(e.user, 0)
        try:
            return request if await self._enqueue_embedding(request, e) else None
        except InputRefused as refused:
            self.release(request)
            raise Refusal(refused.code, refused.message) from None
        except (EngineUnavailable, LoadFailure, ValueError) as error:
            self.release(request)
            raise _refusal(error, slot) from None
        except BaseException:  # a Refusal (released already), unexpected, or cancelled
            self.release(request)
            raise

    async def _enqueue_embedding(self, request: Request, e: Embedding) -> bool:
        slot = self.pool.slot(request.model)
        if (not slot.is_loaded or slot.yielding_to) and not request.cancelled.is_set():
            await self.waits.wait_for(request, slot)
        if request.cancelled.is_set():  # while its model loaded: nothing to tokenize
            return self._end_cancelled(request)
        limits = EmbedLimits.of(slot.loaded.runner.info)
        check_count(len(e.inputs), limits.max_inputs)
        check_dimensions(e.dimensions, limits.n_embd)
        if e.inputs and isinstance(e.inputs[0], str):
            inputs = await slot.prompts.embedding_inputs(e.inputs, limits.max_tokens, e.truncate)
        else:  # token ids: within the body's bound, checked here at once
            inputs = fit_token_lists(e.inputs, limits, e.truncate)
        if request.sink.is_closed or self.is_shutting_down:  # both may come while tokenizing
            self.release(request)
            if self.is_shutting_down:
                raise Refusal("shutting_down", "the server is shutting down")
            return False
        if request.cancelled.is_set():
            return self._end_cancelled(request)
        if request.hold is not None:  # the inputs' tokens held: no reply after them
            self._hold_inputs(request, sum(map(len, inputs)))
        if slot.engine is None:
            raise EngineUnavailable(f"model {slot.name} is not loaded")
        slot.engine.add_embedding(
            request.engine_id, inputs, user=request.user, client_id=request.client_id
        )
        request.is_in_engine = True
        return True

    def _hold_prompt(
        self, request: Request, params: SamplingParams, num_tokens: int
    ) -> SamplingParams:
        """The prompt's tokens held of the quota, the reply's max_tokens cut to what is left
        after them (ops/quotas.py); a prompt that leaves nothing is refused."""
        try:
            max_tokens = self.usage.quotas.hold_prompt(request.hold, num_tokens, params.max_tokens)
        except QuotaExceeded as e:
            self.release(request)
            raise Refusal("quota_exceeded", e.message, e.retry_after_s) from None
        return msgspec.structs.replace(params, max_tokens=max_tokens)

    def _hold_inputs(self, request: Request, num_tokens: int) -> None:
        """An embedding request's inputs held of the quota (it generates nothing after them);
        inputs the quota has no room for are refused."""
        try:
            self.usage.quotas.hold_inputs(request.hold, num_tokens)
        except QuotaExceeded as e:
            self.release(request)
            raise Refusal("quota_exceeded", e.message, e.retry_after_s) from None

    def _end_cancelled(self, request: Request) -> bool:
        """A request cancelled before it reached the engine: it ends with a `done`
        "cancelled" and no tokens, routed as the engine's are (released, its usage row
        recorded, then sent); one whose sink closed is only released (False: nobody reads it)."""
        if request.sink.is_closed or self.on_events is None:
            self.release(request)
            if request.sink.is_closed:
                return False
        timings = {"queue_ms": 0.0, "ttft_ms": None, "itl_ms": None, "e2e_ms": 0.0}
        done = Done(request.engine_id, "cancelled", 0, 0, 0, timings)
        if self.on_events is not None:
            self.on_events([done])
        else:
            request.sink.on_done(request, done)
        return True

    def _admit(self, user: str, max_tokens: int, slot: ModelSlot) -> None:
        """Refusal when a chat of this user's for the model of `slot` is not to be let in."""
        problem = self._check(user, max_tokens, slot)
        if problem:
            if problem.code in ("busy", "shutting_down", "unavailable") and slot.engine:
                slot.engine.reject()  # counted by the engine's metrics
            raise problem

    def _check(self, user: str, max_tokens: int, slot: ModelSlot) -> Refusal | None:
        """Why a chat of this user's is refused before its prompt is built, or None."""
        c, usage = self.config, self.usage
        if self.is_shutting_down:
            return Refusal("shutting_down", "the server is shutting down")
        if slot.engine is not None and (problem := slot.engine.problem):  # down or restarting
            return _unavailable(problem)
        if usage is not None and (why := usage.record_refusal(user)):
            return Refusal("unavailable", why, retry_after_s=RETRY_UNAVAILABLE_S)
        if usage is not None and (over := usage.quotas.refusal(user)):
            return Refusal("quota_exceeded", over.message, retry_after_s=over.retry_after_s)
        if max_tokens > c.max_tokens:
            return Refusal("bad_request", f"max_tokens: at most {c.max_tokens} on this server")
        return self.counts.busy(user, c)

    # --- the requests in flight -------------------------------------------------------------------

    def _open(self, request: Request) -> None:
        self.counts.add(request)
        self.pool.acquire(self.pool.slot(request.model), request.user)

    def release(self, request: Request) -> None:
        """No longer in flight (done, or never queued): uncounted, its quota hold given back."""
        if self.counts.remove(request):
            if request.hold is not None:
                self.usage.quotas.settle(request.hold)
            self.pool.release(self.pool.slot(request.model), request.keep_alive_s)

    def started(self, request: Request) -> None:
        """The engine admitted it to the running batch: it no longer counts as waiting."""
        self.counts.started(request)

    def cancel(self, request: Request) -> None:
        """Cancel at the next step (its cells are freed then); its `done` still comes. One
        still waiting for its model, or having its prompt built, stops at once (submit)."""
        request.cancelled.set()
        engine = self.pool.slot(request.model).engine if request.model else None
        if engine is not None and request.is_in_engine:
            engine.cancel(request.engine_id)

    def cancel_all(self) -> None:
        for request in list(self.counts.requests.values()):
            self.cancel(request)

    async def wait_for_requests(self, timeout: float) -> None:
        """Until every request in flight is done, or `timeout` passed."""
        await self.counts.wait_for_none(timeout)


def _refusal(e: Exception, slot: ModelSlot) -> Refusal:
    """The refusal of a request that failed while its model loaded or its prompt was built."""
    if isinstance(e, EngineUnavailable):  # it went down while the prompt was built
        return _unavailable(str(e))
    if isinstance(e, LoadFailure):
        return Refusal("unavailable", e.message, max(e.retry_after_s, 1))
    if isinstance(e, PromptTooLong):
        if slot.engine is not None:
            slot.engine.reject()
        return Refusal("too_long", str(e))
    return Refusal("bad_request", str(e))


def _chat_to_embedding_model(slot: ModelSlot) -> Refusal | None:
    """The refusal of a chat to a model that only embeds (its GGUF's pooling type, or
    models.toml's kind), else None."""
    info = slot.loaded.runner.info if slot.loaded is not None else None
    if getattr(slot.model, "kind", "chat") == "embedding" or getattr(
        info, "is_embedding_only", False
    ):
        return Refusal(
            "bad_request",
            f"model: {slot.name} is an embedding model; it answers embeddings only "
            "(POST /v1/embeddings, /api/embed), not chats",
        )
    return None


def _unavailable(problem: str) -> Refusal:
    """The refusal while the engine process is down or reloading, with why."""
    message = f"the model is unavailable: {problem}. Try again shortly"
    return Refusal("unavailable", message, RETRY_UNAVAILABLE_S)
