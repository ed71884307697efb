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
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import msgspec

from localserve.chat.constraints import ConstraintCompiler
from localserve.chat.formats import ModelFormats
from localserve.config import ServerConfig
from localserve.engine.client import EngineClient, EngineUnavailable
from localserve.engine.events import Done
from localserve.engine.sampling_params import Constraint, SamplingParams, sampling_params
from localserve.ops.auth import Access, AuthThrottle, address_group
from localserve.ops.usage import Usage
from localserve.protocol.frames import SamplingFields
from localserve.serve.frontends import People
from localserve.serve.prompt import Prompt, PromptBuilder, PromptTooLong

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
        """The people trusted front-ends named (frontends.py), bounded per front-end."""
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
    def model_name(self) -> str: ...

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
        engine: EngineClient,
        prompts: PromptBuilder,
        config: Callable[[], ServerConfig],
        usage: Callable[[], Usage | None],
        access: Access,
        model_name: str,
    ) -> None:
        self.engine = engine
        self.prompts = prompts
        self._config = config
        self.access = access
        self._usage = usage
        self.model_name = model_name
        self.throttle = AuthThrottle(config().max_auth_failures_per_minute)
        self.people = People()  # named by trusted front-ends
        self.requests: dict[str, Request] = {}  # by engine id
        self.constraints = ConstraintCompiler()  # structured output: schemas compiled, cached
        self.formats = ModelFormats(None, None, None)  # the server sets the model's
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

    @property
    def max_model_len(self) -> int:
        return self.prompts.n_ctx

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
    ) -> Request | None:
        """Check the limits and the sampling values, build the prompt, hand it to the engine.

        `response_format` (OpenAI's, the websocket chat frame's) is compiled off the loop into
        the request's constraint (a bad one is a bad_request naming the keyword); a caller
        that compiled its own (tool calling, `self.constraints`) passes `constraint` instead.
        Raises Refusal (busy, shutting_down, too_long, bad_request, quota_exceeded,
        unavailable); returns None when the sink closed while the prompt was being built
        (nothing was queued).
        """
        problem = self._check(user, fields.max_tokens)
        if problem:
            if problem.code in ("busy", "shutting_down", "unavailable"):
                self.engine.reject()
            raise problem
        try:
            if response_format is not None and constraint is None:
                constraint = await self.constraints.response_format(response_format)
            params = sampling_params(fields, constraint=constraint)
        except ValueError as e:  # ConstraintError too
            raise Refusal("bad_request", str(e)) from None
        request = self._open(Request(engine_id, client_id, user, sink))
        allowance = self.usage.allowance(user) if self.usage is not None else None
        if allowance is not None:  # a quota: the reply may use at most what is left of it
            params = msgspec.structs.replace(params, max_tokens=min(params.max_tokens, allowance))
            self._hold(request, params.max_tokens)  # until the prompt's length is known
        try:
            if not await self._enqueue(request, params, fields, allowance is not None, prompt):
                return None
        except EngineUnavailable as e:  # it went down while the prompt was built
            self.release(request)
            raise _unavailable(str(e)) from None
        except PromptTooLong as e:
            self.release(request)
            self.engine.reject()
            raise Refusal("too_long", str(e)) from None
        except Refusal:
            raise
        except ValueError as e:
            self.release(request)
            raise Refusal("bad_request", str(e)) from None
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
        truncate = self.config.context_overflow == "truncate"
        built = await prompt(self.prompts, params.max_tokens if truncate else None)
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
        if has_quota:
            params = self._hold_prompt(request, params, len(built.tokens))
        self.engine.add_request(
            request.engine_id,
            built.tokens,
            params,
            user=request.user,
            system_tokens=built.system_tokens,
            system_is_global=built.is_default_system,
            client_id=request.client_id,
        )
        return True

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

    def _check(self, user: str, max_tokens: int) -> Refusal | None:
        """Why a chat of this user's is refused before its prompt is built, or None."""
        c = self.config
        if self.is_shutting_down:
            return Refusal("shutting_down", "the server is shutting down")
        if problem := self.engine.problem:  # the engine process is down or restarting
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
        return request

    def release(self, request: Request) -> None:
        """No longer in flight (done, or never queued): uncounted, its quota hold given back."""
        if self.requests.pop(request.engine_id, None) is not None:
            self._count(request.user, waiting=-1 if request.is_waiting else 0, inflight=-1)
            if request.reserved_tokens:
                self.usage.release(request.user, request.reserved_tokens)

    def started(self, request: Request) -> None:
        """The engine admitted it to the running batch: it no longer counts as waiting."""
        if request.is_waiting:
            self._count(request.user, waiting=-1, inflight=0)
            request.is_waiting = False

    def cancel(self, request: Request) -> None:
        """Cancel at the next step (its cells are freed then); its `done` still comes."""
        self.engine.cancel(request.engine_id)

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


def _unavailable(problem: str) -> Refusal:
    """The refusal while the engine process is down or reloading, with why."""
    message = f"the model is unavailable: {problem}. Try again shortly"
    return Refusal("unavailable", message, RETRY_UNAVAILABLE_S)
