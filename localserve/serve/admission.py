"""Admission: who and what the server lets in, whichever front-end a chat came through.

Every chat, a websocket frame or an HTTP request, passes `Admission.submit`: per-user and
global bounds, the daily quota (held while the reply runs), the sampling values, the prompt
builder's too-long check, then the engine. A chat the server will not take is a `Refusal`
carrying the protocol's error code (docs/protocol.md), which the websocket protocol sends as an
`error` frame and the HTTP API maps to a status. A token check that fails is an `AuthRefusal`:
failures count per place and claim and per wrong token; past a cap the throttle slows or refuses
wrong tokens, and only slows the right one.

A `Request` is created when a chat is admitted and ends with the engine's `done`; its events go
to its `Sink` (a websocket connection or an HTTP reply, routed by routing.py). Front-ends see
admission through `Frontdoor`: exactly what they use, so they never depend on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from asyncio import FIRST_COMPLETED as FIRST
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import msgspec

from localserve.chat.constraints import ConstraintCompiler
from localserve.chat.formats import ModelFormats
from localserve.config import ServerConfig
from localserve.engine.client import EngineClient, EngineUnavailable
from localserve.engine.events import Done, EventSink
from localserve.engine.sampling_params import Constraint, SamplingParams, sampling_params
from localserve.ops.auth import Access, AuthThrottle, address_group
from localserve.ops.people import PeopleStore
from localserve.ops.usage import Usage
from localserve.protocol.frames import SamplingFields
from localserve.serve.pool import (
    RETRY_LOAD_S,
    LoadFailure,
    ModelPool,
    ModelSlot,
    UnknownModel,
)
from localserve.serve.prompt import Prompt, PromptBuilder, PromptTooLong
from localserve.serve.trusted_proxies import People

log = logging.getLogger("localserve.serve.admission")

# a client refused (or cut short) because the engine process is down may retry this soon after
RETRY_UNAVAILABLE_S = 5
MAX_ERROR_CHARS = 200  # an error message quotes at most this much of what the client sent
# the throttle's refusals: many wrong tokens for one claim from one place, or one wrong token again
LOCKED = "too many failed attempts from your address;"
REPEATED = "too many failed attempts with this token;"

# how a front-end asks for its prompt: built by the server's prompt builder, when admitted; the
# number is the reply's max_tokens when a chat too long for the context is to drop its oldest
# turns (context_overflow = "truncate"), None when it is to be refused ("refuse")
BuildPrompt = Callable[[PromptBuilder, int | None], Awaitable[Prompt]]


class Sink(Protocol):
    """Who gets a request's events: a websocket connection or an HTTP reply."""

    is_closed: bool

    def on_token(self, request: Request, text: str) -> None: ...
    def on_queued(self, request: Request, position: int) -> None: ...
    def on_done(self, request: Request, done: Done) -> None: ...


@dataclass(eq=False)
class Request:
    """A chat in flight: who asked, under which ids, and where its events go."""

    engine_id: str
    client_id: str
    user: str
    sink: Sink
    is_waiting: bool = True
    reserved_tokens: int = 0  # of its user's daily quota, until it is done
    is_recorded: bool = False  # its usage row committed when its `done` went out
    num_dropped_messages: int = 0  # the chat's oldest messages left out to fit the context
    prompt_tail: str = ""  # the rendered prompt's end (it may have opened a reasoning block)
    model: str = ""  # the model's name in models.toml
    slot: ModelSlot | None = None  # the pool's slot of that model
    loading: str = ""  # while its model loads: what it waits for ("loading model X", ...)
    load_ms: float = 0.0  # how long it waited for its model to load (in its TTFT)
    keep_alive_s: float | None = None  # its own keep_alive for the model (Ollama's field)
    # set by a cancel (the client's, or its sink's going away): one still waiting for its
    # model or having its prompt built stops at once, one in the engine at its next step
    cancelled: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    is_in_engine: bool = False  # handed to the engine: its `done` comes from there


class Refusal(Exception):
    """A chat the server will not take: a protocol error code and why."""

    def __init__(self, code: str, message: str, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.code, self.message, self.retry_after_s = code, message, retry_after_s


class AuthRefusal(NamedTuple):
    """A token check that failed: its own refusal, or the throttle's."""

    message: str
    retry_after_s: float  # > 0: the throttle's refusal (with when to try again)


class Frontdoor(Protocol):
    """What a front-end (the websocket protocol, the HTTP API) may ask of the server."""

    @property
    def config(self) -> ServerConfig:
        """The server's settings as they are now (tests change them on a live server)."""
        ...

    @property
    def access(self) -> Access:
        """Who may connect: the users' tokens and the monitor token."""
        ...

    @property
    def people(self) -> People:
        """The people trusted front-ends named (trusted_proxies.py), bounded per front-end."""
        ...

    @property
    def constraints(self) -> ConstraintCompiler:
        """Structured output's compiler (schemas, Lark grammars: checked, bounded, cached); a
        constraint it gives goes to `submit(..., constraint=...)`."""
        ...

    @property
    def prompts(self) -> PromptBuilder:
        """The prompt builder: a prompt rendered and counted without generating (the
        Anthropic API's count_tokens)."""
        ...

    @property
    def model_name(self) -> str:
        """The model this door serves (the server's default on the server's own door)."""
        ...

    @property
    def model_names(self) -> list[str]:
        """Every configured model, the default first."""
        ...

    def model(self, name: str | None) -> Frontdoor:
        """The door of the model `name` (None: the default); UnknownModel (a ValueError) naming
        the configured models."""
        ...

    def describe_models(self) -> list[dict]:
        """Every model's state (pool.py's ModelSlot.describe), the default first."""
        ...

    async def model_choices(self) -> list[dict]:
        """describe_models, each with what choosing it now costs (pool.py's `Choice`: the
        models its load would unload, about how long it takes)."""
        ...

    async def loaded_prompts(self) -> PromptBuilder:
        """This model's prompt builder, loading the model if it is not (Refusal when it
        cannot be loaded)."""
        ...

    async def warm(self, keep_alive_s: float | None) -> None:
        """Ollama's empty request: load this model and give it `keep_alive_s` (0: unload it
        now when it is idle, without loading it). Refusal when it cannot be loaded."""
        ...

    @property
    def formats(self) -> ModelFormats:
        """The model's call and reasoning formats (what its replies are read for)."""
        ...

    @property
    def max_model_len(self) -> int:
        """The model's context length (n_ctx): prompt and reply together, in tokens."""
        ...

    @property
    def is_shutting_down(self) -> bool: ...

    @property
    def records_usage(self) -> bool:
        """A usage record is kept: a `done` says whether its row was committed."""
        ...

    @property
    def num_waiting(self) -> int:
        """Requests admitted and not yet running, all users together."""
        ...

    async def authenticate(
        self, address: str, claim: str, token: str | None, allowed: bool, refusal: str
    ) -> AuthRefusal | None: ...

    def next_number(self) -> int:
        """A number no other connection or HTTP request of this server has."""
        ...

    def is_in_flight(self, engine_id: str) -> bool: ...

    async def submit(
        self,
        sink: Sink,
        user: str,
        client_id: str,
        engine_id: str,
        fields: SamplingFields,
        prompt: BuildPrompt,
        response_format: Any = None,
        constraint: Constraint | None = None,
        keep_alive_s: float | None = None,
        cancelled: asyncio.Event | None = None,
    ) -> Request | None: ...

    def cancel(self, request: Request) -> None: ...


@dataclass
class Counts:
    """Requests in flight (admitted, `done` not yet routed) and waiting, in all and per user."""

    waiting: int = 0
    waiting_per_user: dict[str, int] = field(default_factory=dict)
    inflight_per_user: dict[str, int] = field(default_factory=dict)


class Admission:
    """The server's admission: token checks, limits, quotas, the requests in flight (a
    `Frontdoor`). `config` and `usage` are read at every use: the server's current ones."""

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
        self.throttle = AuthThrottle(config().max_auth_failures_per_minute)
        self.people = People(people)  # named by trusted front-ends, kept in `people`
        self.requests: dict[str, Request] = {}  # by engine id
        self.constraints = ConstraintCompiler()  # structured output: schemas compiled, cached
        self.counts = Counts()
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

    # --- the models: the default's here, another's through its door (model()) ----------------

    @property
    def model_name(self) -> str:
        return self.pool.default

    @property
    def model_names(self) -> list[str]:
        default = self.pool.default
        return [default, *(n for n in self.pool.names if n != default)]

    @property
    def engine(self) -> EngineClient | None:
        """The default model's engine (None while it is not loaded)."""
        return self.pool.slot(None).engine

    @property
    def prompts(self) -> PromptBuilder | None:
        return self.pool.slot(None).prompts

    @property
    def formats(self) -> ModelFormats:
        return self.pool.slot(None).formats

    @property
    def max_model_len(self) -> int:
        return self.pool.slot(None).n_ctx

    def model(self, name: str | None) -> Frontdoor:
        slot = self.pool.slot(name)
        return self if slot.name == self.pool.default else ModelDoor(self, slot)

    def describe_models(self) -> list[dict]:
        loading: dict[str, int] = {}  # requests waiting for their model to load, per model
        for request in self.requests.values():
            if request.loading:
                loading[request.model] = loading.get(request.model, 0) + 1
        return [
            self.pool.slot(n).describe() | {"waiting": loading.get(n, 0)} for n in self.model_names
        ]

    async def model_choices(self) -> list[dict]:
        described = self.describe_models()
        choices = [await self.pool.choice(self.pool.slot(m["name"])) for m in described]
        return [m | dataclasses.asdict(c) for m, c in zip(described, choices, strict=True)]

    async def loaded_prompts(self, name: str | None = None) -> PromptBuilder:
        """The prompt builder of `name` (None: the default), loading it if it is not."""
        slot = self.pool.slot(name)
        await self._ready(slot)
        return slot.prompts

    async def _ready(self, slot: ModelSlot, held: bool = False) -> None:
        limit = self.config.max_model_wait_s
        try:
            await asyncio.wait_for(self.pool.ready(slot, lambda reason: None, held), limit)
        except LoadFailure as e:
            raise Refusal("unavailable", e.message, max(e.retry_after_s, 1)) from None
        except TimeoutError:
            message = f"model {slot.name} was not ready within {limit:g} s"
            raise Refusal("unavailable", message, RETRY_LOAD_S) from None

    async def warm(self, keep_alive_s: float | None, name: str | None = None) -> None:
        """Load `name` (None: the default) and give it `keep_alive_s` (Frontdoor.warm)."""
        slot = self.pool.slot(name)
        if keep_alive_s == 0 and not slot.is_loaded:
            return
        self.pool.acquire(slot)
        try:
            if keep_alive_s != 0:
                await self._ready(slot, held=True)
        finally:
            self.pool.release(slot, keep_alive_s)  # its timer armed, or unloaded at once

    @property
    def num_waiting(self) -> int:
        return self.counts.waiting

    def next_number(self) -> int:
        return next(self._numbers)

    def is_in_flight(self, engine_id: str) -> bool:
        return engine_id in self.requests

    # --- identity -------------------------------------------------------------------------------

    async def authenticate(
        self, address: str, claim: str, token: str | None, allowed: bool, refusal: str
    ) -> AuthRefusal | None:
        """None when a token check passed; else why not (its refusal, or the throttle's).

        Failures count per place and claim (a user name, "api key", "monitor"), and per wrong
        token: the same wrong token again is refused at once past the cap (uncounted), and many
        different ones lock the claim from that place, where each new attempt then waits its
        turn before its answer. A token that passed from that place recently skips the turn: a
        wrong client does not lock out a right one that was already in, and guessing stays at
        the cap's rate. (A right token new to that place takes a turn like any other.)
        """
        t = self.throttle
        key = f"{address_group(address)} {claim}"
        credential = t.credential(key, token)
        if allowed and t.is_known_good(credential):
            return None
        if not allowed and t.has_failed(credential):  # nothing new to learn: no turn needed
            if wait := t.retry_after(credential):
                return AuthRefusal(f"{REPEATED} try again in {max(wait, 1):.0f} s", wait)
            return self._failed(address, key, credential, refusal, claim)
        wait = t.turn(key)
        if wait > t.interval_s:  # another attempt from there waits its turn
            return AuthRefusal(f"{LOCKED} try again in {wait:.0f} s", wait)
        if wait > 0:
            await asyncio.sleep(wait)
        if allowed:
            t.passed(credential)
            return None
        refused = self._failed(address, key, credential, refusal, claim)
        if wait > 0:
            return AuthRefusal(f"{LOCKED} try again in {t.interval_s:.0f} s", t.interval_s)
        return refused

    def _failed(
        self, address: str, key: str, credential: str, refusal: str, claim: str
    ) -> AuthRefusal:
        """Count a wrong token (and log it); its own refusal."""
        self.throttle.failed(key, credential)
        log.warning("%s: %s (%s)", address, refusal, claim)
        return AuthRefusal(refusal, 0.0)

    # --- every chat, websocket or HTTP ------------------------------------------------------------

    async def submit(
        self,
        sink: Sink,
        user: str,
        client_id: str,
        engine_id: str,
        fields: SamplingFields,
        prompt: BuildPrompt,
        response_format: Any = None,
        constraint: Constraint | None = None,
        keep_alive_s: float | None = None,
        model: str | None = None,
        cancelled: asyncio.Event | None = None,
    ) -> Request | None:
        """Check the limits and the sampling values, build the prompt, hand it to the engine.

        `response_format` (OpenAI's, the websocket chat frame's) is compiled off the loop into
        the request's constraint (a bad one is a bad_request naming the keyword); a caller
        that compiled its own (tool calling, `self.constraints`) passes `constraint` instead.
        Raises Refusal (busy, shutting_down, too_long, bad_request, quota_exceeded,
        unavailable); returns None when the sink closed while the prompt was being built
        (nothing was queued). `model`: its name (None: the default), loaded here when it is not
        (the request waits, `loading`, and is refused when the load fails). `cancelled`: a
        cancel before the caller holds the request; set while the model loads or the prompt is
        built, it stops at once with a `done` "cancelled" (none when its sink closed: None).
        """
        slot = self._admissible(user, fields.max_tokens, model)
        try:
            if response_format is not None and constraint is None:
                constraint = await self.constraints.response_format(response_format)
            params = sampling_params(fields, constraint=constraint)
        except ValueError as e:  # ConstraintError too
            raise Refusal("bad_request", str(e)) from None
        request = Request(engine_id, client_id, user, sink, model=slot.name, slot=slot)
        request.keep_alive_s, request.cancelled = keep_alive_s, cancelled or request.cancelled
        request = self._open(request)
        allowance = self.usage.allowance(user) if self.usage is not None else None
        if allowance is not None:  # a quota: the reply may use at most what is left of it
            params = msgspec.structs.replace(params, max_tokens=min(params.max_tokens, allowance))
            self._hold(request, params.max_tokens)  # until the prompt's length is known
        try:
            if not await self._enqueue(request, params, fields, allowance is not None, prompt):
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
        self,
        request: Request,
        params: SamplingParams,
        fields: SamplingFields,
        has_quota: bool,
        prompt: BuildPrompt,
    ) -> bool:
        """Build the prompt and hand the request to the engine; False when its sink closed
        meanwhile (it is released here: nothing was queued)."""
        slot = request.slot
        if (not slot.is_loaded or slot.yielding_to) and not request.cancelled.is_set():
            await self._wait_for_model(request, slot)
        if request.cancelled.is_set():  # while its model loaded: no prompt to build
            return self._end_cancelled(request)
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
        if has_quota:
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

    async def _wait_for_model(self, request: Request, slot: ModelSlot) -> None:
        """Until the request's model is loaded or the request is cancelled; its sink is told
        it waits (`loading`), and why when it waits for memory. LoadFailure when the model
        cannot be loaded. A cancelled request stops waiting at once: pool.ready's wait is
        shielded, so the load goes on for the others (and ends idle when none is left)."""
        started = time.monotonic()

        def waiting(reason: str) -> None:
            if reason == request.loading:  # told already
                return
            request.loading = reason
            if not request.sink.is_closed:
                request.sink.on_queued(request, self.num_waiting)

        turn = f"waiting for its turn: model {slot.yielding_to} loads first"
        waiting(turn if slot.yielding_to else f"loading model {slot.name}")
        ready = asyncio.ensure_future(self.pool.ready(slot, waiting, held=True))
        cancelled = asyncio.ensure_future(request.cancelled.wait())
        limit = self.config.max_model_wait_s
        try:
            await asyncio.wait((ready, cancelled), timeout=limit, return_when=FIRST)
            if not ready.done() and not cancelled.done():
                why = request.loading
                raise LoadFailure(
                    f"model {slot.name} was not ready within {limit:g} s ({why})", RETRY_LOAD_S
                )
        finally:
            cancelled.cancel()
            if not ready.done():  # its hold on the slot is back before the caller releases it
                ready.cancel()
                await asyncio.wait({ready})
            request.loading = ""
            request.load_ms = (time.monotonic() - started) * 1e3
        if ready.done() and not ready.cancelled():
            ready.result()  # its LoadFailure

    def _hold(self, request: Request, tokens: int) -> None:
        """Reserve (or, negative, give back) tokens of the user's quota for this request."""
        request.reserved_tokens += tokens
        if tokens > 0:
            self.usage.reserve(request.user, tokens)
        else:
            self.usage.release(request.user, -tokens)

    def _hold_prompt(
        self, request: Request, params: SamplingParams, num_tokens: int
    ) -> SamplingParams:
        """The prompt's tokens count against the quota from now on (all of them: what the cache
        saves is known only at the end, when the row settles it), and the reply may use what is
        left after it: requests in flight at once stay within the quota together."""
        usage, user = self.usage, request.user
        if over := usage.prompt_refusal(user, num_tokens, request.reserved_tokens):
            self.release(request)
            raise Refusal("quota_exceeded", over[0], retry_after_s=over[1])
        left = usage.left(user, request.reserved_tokens)
        max_tokens = min(params.max_tokens, left - num_tokens)
        self._hold(request, num_tokens + max_tokens - params.max_tokens)
        return msgspec.structs.replace(params, max_tokens=max_tokens)

    def _admissible(self, user: str, max_tokens: int, model: str | None) -> ModelSlot:
        """The slot of the model a chat asks for; Refusal when it is not to be let in."""
        try:
            slot = self.pool.slot(model)
        except UnknownModel as e:
            raise Refusal("bad_request", str(e)) from None
        problem = self._check(user, max_tokens, slot)
        if problem:
            if problem.code in ("busy", "shutting_down", "unavailable") and slot.engine:
                slot.engine.reject()  # counted by the engine's metrics
            raise problem
        return slot

    def _check(self, user: str, max_tokens: int, slot: ModelSlot) -> Refusal | None:
        """Why a chat of this user's is refused before its prompt is built, or None."""
        c = self.config
        if self.is_shutting_down:
            return Refusal("shutting_down", "the server is shutting down")
        if slot.engine is not None and (problem := slot.engine.problem):  # down or restarting
            return _unavailable(problem)
        if self.usage is not None and (why := self.usage.record_refusal(user)):
            return Refusal("unavailable", why, retry_after_s=RETRY_UNAVAILABLE_S)
        if self.usage is not None and (over := self.usage.quota_refusal(user)):
            return Refusal("quota_exceeded", over[0], retry_after_s=over[1])
        if max_tokens > c.max_tokens:
            return Refusal("bad_request", f"max_tokens: at most {c.max_tokens} on this server")
        if self.counts.inflight_per_user.get(user, 0) >= c.max_inflight_per_user:
            message = f"{c.max_inflight_per_user} requests of yours are already in flight"
            return Refusal("busy", message, retry_after_s=1)
        if self.counts.waiting_per_user.get(user, 0) >= c.max_queued_per_user:
            message = f"{c.max_queued_per_user} requests of yours are already queued"
            return Refusal("busy", message, retry_after_s=1)
        if self.counts.waiting >= c.max_queued:
            message = f"the queue is full ({c.max_queued} waiting); try again shortly"
            return Refusal("busy", message, retry_after_s=1)
        return None

    # --- the requests in flight -------------------------------------------------------------------

    def _open(self, request: Request) -> Request:
        self.requests[request.engine_id] = request
        self._count(request.user, waiting=+1, inflight=+1)
        self.pool.acquire(request.slot)
        return request

    def release(self, request: Request) -> None:
        """No longer in flight (done, or never queued): uncounted, its quota hold given back."""
        if self.requests.pop(request.engine_id, None) is not None:
            self._count(request.user, waiting=-1 if request.is_waiting else 0, inflight=-1)
            if request.reserved_tokens:
                self.usage.release(request.user, request.reserved_tokens)
            self.pool.release(request.slot, request.keep_alive_s)

    def started(self, request: Request) -> None:
        """The engine admitted it to the running batch: it no longer counts as waiting."""
        if request.is_waiting:
            self._count(request.user, waiting=-1, inflight=0)
            request.is_waiting = False

    def cancel(self, request: Request) -> None:
        """Cancel at the next step (its cells are freed then); its `done` still comes. One
        still waiting for its model, or having its prompt built, stops at once (submit)."""
        request.cancelled.set()
        engine = request.slot.engine if request.slot is not None else None
        if engine is not None and request.is_in_engine:
            engine.cancel(request.engine_id)

    def cancel_all(self) -> None:
        for request in list(self.requests.values()):
            self.cancel(request)

    async def wait_for_requests(self, timeout: float) -> None:
        """Until every request in flight is done, or `timeout` passed."""
        with contextlib.suppress(asyncio.TimeoutError):
            async with asyncio.timeout(timeout):
                while self.requests:
                    await asyncio.sleep(0.02)

    def _count(self, user: str, waiting: int, inflight: int) -> None:
        c = self.counts
        c.waiting += waiting
        c.waiting_per_user[user] = c.waiting_per_user.get(user, 0) + waiting
        c.inflight_per_user[user] = c.inflight_per_user.get(user, 0) + inflight
        for table in (c.waiting_per_user, c.inflight_per_user):
            if not table[user]:
                del table[user]


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


def _unavailable(problem: str) -> Refusal:
    """The refusal while the engine process is down or reloading, with why."""
    message = f"the model is unavailable: {problem}. Try again shortly"
    return Refusal("unavailable", message, RETRY_UNAVAILABLE_S)


class ModelDoor:
    """Admission as one model's front door (a `Frontdoor`): what is the model's (its name,
    formats, context, prompt builder) is that model's, everything else is admission's, and a
    chat submitted here goes to that model."""

    def __init__(self, admission: Admission, slot: ModelSlot) -> None:
        self._admission = admission
        self._slot = slot

    @property
    def config(self) -> ServerConfig:
        return self._admission.config

    @property
    def access(self) -> Access:
        return self._admission.access

    @property
    def people(self) -> People:
        return self._admission.people

    @property
    def constraints(self) -> ConstraintCompiler:
        return self._admission.constraints

    @property
    def prompts(self) -> PromptBuilder | None:
        return self._slot.prompts

    @property
    def model_name(self) -> str:
        return self._slot.name

    @property
    def model_names(self) -> list[str]:
        return self._admission.model_names

    def model(self, name: str | None) -> Frontdoor:
        return self._admission.model(name)

    def describe_models(self) -> list[dict]:
        return self._admission.describe_models()

    async def model_choices(self) -> list[dict]:
        return await self._admission.model_choices()

    async def loaded_prompts(self) -> PromptBuilder:
        return await self._admission.loaded_prompts(self._slot.name)

    async def warm(self, keep_alive_s: float | None) -> None:
        await self._admission.warm(keep_alive_s, self._slot.name)

    @property
    def formats(self) -> ModelFormats:
        return self._slot.formats

    @property
    def max_model_len(self) -> int:
        return self._slot.n_ctx

    @property
    def is_shutting_down(self) -> bool:
        return self._admission.is_shutting_down

    @property
    def records_usage(self) -> bool:
        return self._admission.records_usage

    @property
    def num_waiting(self) -> int:
        return self._admission.num_waiting

    async def authenticate(
        self, address: str, claim: str, token: str | None, allowed: bool, refusal: str
    ) -> AuthRefusal | None:
        return await self._admission.authenticate(address, claim, token, allowed, refusal)

    def next_number(self) -> int:
        return self._admission.next_number()

    def is_in_flight(self, engine_id: str) -> bool:
        return self._admission.is_in_flight(engine_id)

    async def submit(self, sink: Sink, user: str, client_id: str, engine_id: str,
                     fields: SamplingFields, prompt: BuildPrompt, response_format: Any = None,
                     constraint: Constraint | None = None, keep_alive_s: float | None = None,
                     cancelled: asyncio.Event | None = None) -> Request | None:  # fmt: skip
        return await self._admission.submit(
            sink, user, client_id, engine_id, fields, prompt, response_format, constraint,
            keep_alive_s, model=self._slot.name, cancelled=cancelled,
        )  # fmt: skip

    def cancel(self, request: Request) -> None:
        self._admission.cancel(request)
