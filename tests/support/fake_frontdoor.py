"""A fake `Frontdoor` for the front-ends' unit tests: the seam every front-end sees
(localserve/serve/admission.py's Protocol) in plain Python, with no pool, no engine and no
llama.cpp behind it.

`FakeFrontdoor` answers each member the front-ends use: a config, an Access, People (kept in
memory), the models' names, formats and states, a token check, a prompt builder's stand-in
(`FakePrompts`, which keeps what it was asked to render) and `submit`, which keeps what it was
given (a `Submission`), applies the per-user caps of the config as admission does, builds the
prompt and returns a `Request`. The test then plays the engine through the fake: `token`,
`finish` (a `done` with its finish reason and counts), a refusal for the next chat
(`refuse_next`, raised as admission's `Refusal(code, message, retry_after_s)`), a scripted
reply (`script`); `cancelled` lists what the front-end cancelled, and a cancel ends its request
with a `done` "cancelled" as the engine's next step would.

`embed` checks and tokenizes an `Embedding`'s inputs with admission's own bounds
(serve/embedding_inputs.py, the model's `FakeModel` limits; a token a word after a BOS) and,
unless `hold_embeddings`, embeds them at once: a vector of n_embd dimensions per input, from its
tokens, L2-normalised (the sink cuts it to the dimensions asked for), then a `done` counting
the tokens;
`embedded` plays that by hand.

Everything that depends on the seam's shape lives here (the Protocol's members, `submit`'s
parameters, where `Refusal` and `Request` come from): tests import the seam's types from this
module and drive requests through its helpers, never through `submit` itself, so a change of
the seam is adapted in this one file.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from localserve.chat.constraints import ConstraintCompiler
from localserve.chat.formats import ModelFormats
from localserve.config import ServerConfig
from localserve.engine.events import Done
from localserve.ops.auth import Access
from localserve.serve.door import (
    MAX_EMBED_INPUTS,
    AuthRefusal,
    Embedding,
    Frontdoor,
    ModelDescription,
    ModelOption,
    PullProgress,
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
    tokenize_texts,
)
from localserve.serve.prompt import NO_EXTRAS, ChatExtras, Prompt, PromptTooLong
from localserve.serve.trusted_proxies import People

__all__ = [
    "AuthRefusal",
    "Embedding",
    "FakeFrontdoor",
    "FakeModel",
    "FakePrompts",
    "Frontdoor",
    "Refusal",
    "Request",
]

MODEL = "tiny"  # the fake's default model
TIMINGS = {"queue_ms": 1.0, "ttft_ms": 5.0, "itl_ms": 2.0, "e2e_ms": 20.0}
PLAIN = ModelFormats(None, None, None)  # a model whose replies are plain text
HERMES_THINKING = ModelFormats("hermes", "think", "hermes")  # calls and <think> reasoning


class FakeModel(NamedTuple):
    """One configured model as the door describes it."""

    formats: ModelFormats = PLAIN
    n_ctx: int = 4096
    state: str = "loaded"  # loaded | loading | unloaded | failed
    memory_mib: float | None = 300.0
    expires_at: float | None = None
    n_vocab: int = 1000
    n_embd: int = 8
    max_embed_inputs: int = 2048
    max_embed_tokens: int = 512


class FakePrompts:
    """The prompt builder's stand-in: it keeps what it is asked to render (`asked`: the kind,
    the messages or text, the reply tokens, the extras) and gives one token per word; a `gate`
    holds a chat's render (a prompt still being built) until the test opens it."""

    def __init__(self) -> None:
        self.asked: list[tuple] = []
        self.tail = ""  # the rendered prompt's end (an opened <think>, say)
        self.too_long: int | None = None  # the next render's tokens, over the context
        self.n_ctx = 4096  # the context a too-long prompt is said not to fit
        self.num_dropped_messages = 0
        self.gate: asyncio.Event | None = None  # when given, a render waits until it is set

    async def chat(
        self, messages, reply_tokens: int | None = None, extras: ChatExtras = NO_EXTRAS
    ) -> Prompt:
        self.asked.append(("chat", list(messages), reply_tokens, extras))
        if self.gate is not None:
            await self.gate.wait()
        return self._prompt(" ".join(m[1] for m in messages))

    async def text(self, text: str) -> Prompt:
        self.asked.append(("text", text, None, NO_EXTRAS))
        return self._prompt(text)

    def _prompt(self, text: str) -> Prompt:
        if self.too_long is not None:
            num_tokens, self.too_long = self.too_long, None
            raise PromptTooLong(num_tokens, self.n_ctx)
        tokens = list(range(len(text.split()) + 1))  # a BOS, then a token a word
        return Prompt(tokens, (), 0, False, False, self.num_dropped_messages, self.tail)


class KeptPeople:
    """The store of trusted front-ends' people (ops/people.py's PeopleStore) in memory."""

    def __init__(self) -> None:
        self.kept: list = []

    def bindings(self) -> list:
        return list(self.kept)

    async def bind(self, binding) -> None:
        self.kept.append(binding)


@dataclass
class Backstage:
    """What every model's door of one fake shares: the server's side of the seam."""

    config: ServerConfig
    access: Access
    records_usage: bool = False
    is_shutting_down: bool = False
    done_on_cancel: bool = True  # a cancel ends the request with a `done`, as the engine's
    submitted: list[Submission] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    requests: dict[str, Request] = field(default_factory=dict)  # in flight, by engine id
    cancelled: list[Request] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)  # the next chats get these
    scripts: list[tuple[list[str], dict]] = field(default_factory=list)
    checked: list[tuple] = field(default_factory=list)  # (address, claim, token, allowed)
    warmed: list[tuple[str, float | None]] = field(default_factory=list)
    pulled: list[tuple[str, str | None]] = field(default_factory=list)  # (spec, name) asked
    throttle_s: float = 0.0  # > 0: every token check is refused by the throttle
    numbers: Any = field(default_factory=lambda: itertools.count(1))
    prompts: FakePrompts = field(default_factory=FakePrompts)
    tasks: set = field(default_factory=set)
    embeddings: list[Embedding] = field(default_factory=list)  # as they were handed in
    embedded_tokens: list[list[list[int]]] = field(default_factory=list)  # their inputs' tokens
    hold_embeddings: bool = False  # True: the test plays each one's vectors (`embedded`)


class FakeFrontdoor:
    """The seam as a front-end sees it; `model(name)` gives that model's door over the same
    backstage. The settings: `config`, `access`, `is_shutting_down`, `records_usage` (shared
    by every model's door), `models` (by name, the default first)."""

    def __init__(
        self,
        config: ServerConfig | None = None,
        access: Access | None = None,
        models: dict[str, FakeModel] | None = None,
        records_usage: bool = False,
    ) -> None:
        self.stage = Backstage(config or ServerConfig(), access or Access({}), records_usage)
        self.people = People(KeptPeople())  # trusted front-ends' people, kept in memory
        self.constraints = ConstraintCompiler()
        self.models = models or {MODEL: FakeModel()}
        self.model_name = next(iter(self.models))

    # --- the Frontdoor's members (the settings, set on any model's door, are every door's) -----

    @property
    def config(self) -> ServerConfig:
        return self.stage.config

    @config.setter
    def config(self, config: ServerConfig) -> None:
        self.stage.config = config

    @property
    def access(self) -> Access:
        return self.stage.access

    @property
    def records_usage(self) -> bool:
        return self.stage.records_usage

    @property
    def is_shutting_down(self) -> bool:
        return self.stage.is_shutting_down

    @is_shutting_down.setter
    def is_shutting_down(self, value: bool) -> None:
        self.stage.is_shutting_down = value

    @property
    def prompts(self) -> FakePrompts:
        return self.stage.prompts

    @property
    def model_names(self) -> list[str]:
        return list(self.models)

    @property
    def formats(self) -> ModelFormats:
        return self.models[self.model_name].formats

    @property
    def max_model_len(self) -> int:
        return self.models[self.model_name].n_ctx

    @property
    def num_waiting(self) -> int:
        return sum(r.is_waiting for r in self.stage.requests.values())

    def model(self, name: str | None) -> FakeFrontdoor:
        if name is not None and name not in self.models:
            raise ValueError(f"no model {name!r}; this server has {', '.join(self.models)}")
        door = copy.copy(self)  # the same backstage, settings and models
        door.model_name = name or next(iter(self.models))
        return door

    def describe_models(self) -> list[ModelDescription]:
        return [_described(name, m) for name, m in self.models.items()]

    async def model_choices(self) -> list[ModelOption]:
        free = {"swap": [], "swap_waits": False, "too_big": False, "load_s": None}
        return [ModelOption(**m, **free, load_s_from="") for m in self.describe_models()]

    async def loaded_prompts(self) -> FakePrompts:
        self._raise_queued_refusal()
        return self.prompts

    async def pull(self, spec: str, name: str | None) -> AsyncIterator[PullProgress]:
        """A pull that succeeds at once (the real one runs `localserve pull`: serve/pulling.py)."""
        self.stage.pulled.append((spec, name))
        yield PullProgress(status="pulling manifest")
        yield PullProgress(status="success")

    async def warm(self, keep_alive_s: float | None) -> None:
        self.stage.warmed.append((self.model_name, keep_alive_s))
        self._raise_queued_refusal()

    async def authenticate(
        self, address: str, claim: str, token: str | None, allowed: bool, refusal: str
    ) -> AuthRefusal | None:
        self.stage.checked.append((address, claim, token, allowed))
        wait = self.stage.throttle_s
        if wait:
            return AuthRefusal(f"too many failed attempts from your address; try again in "
                               f"{wait:.0f} s", wait)  # fmt: skip
        return None if allowed else AuthRefusal(refusal, 0.0)

    def next_number(self) -> int:
        return next(self.stage.numbers)

    def is_in_flight(self, engine_id: str) -> bool:
        return engine_id in self.stage.requests

    async def submit(self, submission: Submission) -> Request | None:
        return await self._admit(submission)

    async def embed(self, embedding: Embedding) -> Request | None:
        return await self._admit_embedding(embedding)

    def cancel(self, request: Request) -> None:
        self.stage.cancelled.append(request)
        request.cancelled.set()
        if self.stage.done_on_cancel and request.engine_id in self.stage.requests:
            asyncio.get_running_loop().call_soon(self._end_cancelled, request)

    # --- the engine's side, played by the test ---------------------------------------------

    def refuse_next(self, code: str, message: str, retry_after_s: float = 0.0) -> None:
        """The next chat (or warm-up, or count) is refused so, as admission refuses one."""
        self.stage.refusals.append(Refusal(code, message, retry_after_s))

    def script(self, *tokens: str, **done) -> None:
        """The next admitted chat gets these tokens, then its `done` (`finish`'s arguments)."""
        self.stage.scripts.append((list(tokens), done))

    @property
    def submitted(self) -> list[Submission]:
        return self.stage.submitted

    @property
    def cancelled(self) -> list[Request]:
        return self.stage.cancelled

    @property
    def in_flight(self) -> list[Request]:
        return list(self.stage.requests.values())

    async def admitted(self, n: int = 1, timeout: float = 30.0) -> Request:
        """The `n`th request admitted, once it is."""
        async with asyncio.timeout(timeout):
            while len(self.stage.admitted) < n:
                await asyncio.sleep(0.001)
        return self.stage.admitted[n - 1]

    def user_of(self, n: int = 1) -> str:
        """Whose the `n`th chat submitted was."""
        return self.stage.submitted[n - 1].user

    def max_tokens_of(self, n: int = 1) -> int:
        return self.stage.submitted[n - 1].fields.max_tokens

    def fields_of(self, n: int = 1):
        """The sampling fields of the `n`th chat submitted."""
        return self.stage.submitted[n - 1].fields

    def keep_alive_of(self, n: int = 1) -> float | None:
        """The keep_alive the `n`th chat asked for its model (Ollama's), in seconds."""
        return self.stage.submitted[n - 1].keep_alive_s

    def response_format_of(self, n: int = 1):
        """The response_format the `n`th chat asked for (admission compiles it)."""
        return self.stage.submitted[n - 1].response_format

    def constraint_of(self, n: int = 1):
        """The constraint the `n`th chat was submitted with (a forced call's grammar)."""
        return self.stage.submitted[n - 1].constraint

    def is_told_to_stop(self, n: int = 1) -> bool:
        """The `n`th chat's admission was told to stop (its client left or cancelled)."""
        cancelled = self.stage.submitted[n - 1].cancelled
        return cancelled is not None and cancelled.is_set()

    def token(self, request: Request, text: str) -> None:
        """A token's text for the request (the engine admitted it: no longer waiting)."""
        request.is_waiting = False
        request.sink.on_token(request, text)

    def queued(self, request: Request, position: int = 1, wait_s: float | None = None) -> None:
        """Its place in line and the predicted wait, as routing.py tells a sink."""
        request.sink.on_queued(request, position, wait_s)

    def finish(
        self,
        request: Request,
        finish_reason: str = "stop",
        prompt_tokens: int = 7,
        completion_tokens: int = 3,
        cached_tokens: int = 0,
        error: str = "",
        error_code: str = "internal",
        stop: str = "",
        recorded: bool = True,
    ) -> Done:
        """The request's `done`, routed as the server routes it: out of flight, its usage row
        (`recorded`), then to its sink."""
        done = Done(request.engine_id, finish_reason, prompt_tokens, completion_tokens,
                    cached_tokens, dict(TIMINGS), error, error_code, stop)  # fmt: skip
        self.stage.requests.pop(request.engine_id, None)
        request.is_recorded = recorded and self.records_usage
        request.sink.on_done(request, done)
        return done

    # --- admission, as far as a front-end can tell ---------------------------------------------

    async def _admit(self, submitted: Submission) -> Request | None:
        self.stage.submitted.append(submitted)
        self._raise_queued_refusal()
        if refusal := self._over_a_cap(submitted.user):
            raise refusal
        truncate = self.config.context_overflow == "truncate"
        try:
            built = await submitted.prompt(
                self.prompts, submitted.fields.max_tokens if truncate else None
            )
        except PromptTooLong as e:
            raise Refusal("too_long", str(e)) from None
        request = Request(submitted.engine_id, submitted.client_id, submitted.user,
                          submitted.sink, model=self.model_name)  # fmt: skip
        request.keep_alive_s = submitted.keep_alive_s
        request.cancelled = submitted.cancelled or request.cancelled
        request.num_dropped_messages, request.prompt_tail = built.num_dropped_messages, built.tail
        if submitted.sink.is_closed:  # gone while its prompt was built: nothing queued
            return None
        self.stage.requests[request.engine_id] = request
        self.stage.admitted.append(request)
        if request.cancelled.is_set():  # before it reached the engine: a `done` at once
            self._end_cancelled(request)
        elif self.stage.scripts:
            tokens, done = self.stage.scripts.pop(0)
            task = asyncio.create_task(self._play(request, tokens, done))
            self.stage.tasks.add(task)
            task.add_done_callback(self.stage.tasks.discard)
        return request

    async def _admit_embedding(self, e: Embedding) -> Request | None:
        self.stage.embeddings.append(e)
        self._raise_queued_refusal()
        if refusal := self._over_a_cap(e.user):
            raise refusal
        m = self.models[self.model_name]
        limits = EmbedLimits(m.n_vocab, m.n_embd, m.max_embed_inputs, m.max_embed_tokens)
        await asyncio.sleep(0)  # its model is ready, or loads
        try:
            check_count(len(e.inputs), min(MAX_EMBED_INPUTS, limits.max_inputs))
            check_dimensions(e.dimensions, limits.n_embd)
            if e.inputs and isinstance(e.inputs[0], str):
                inputs = tokenize_texts(e.inputs, _words, limits.max_tokens, e.truncate)
            else:
                inputs = fit_token_lists(e.inputs, limits, e.truncate)
        except InputRefused as refused:
            raise Refusal(refused.code, refused.message) from None
        request = Request(e.engine_id, e.client_id, e.user, e.sink, model=self.model_name)
        request.keep_alive_s, request.dimensions = e.keep_alive_s, e.dimensions
        request.cancelled = e.cancelled or request.cancelled
        if e.sink.is_closed:
            return None
        self.stage.requests[request.engine_id] = request
        self.stage.admitted.append(request)
        self.stage.embedded_tokens.append(inputs)
        if request.cancelled.is_set():
            self._end_cancelled(request)
        elif not self.stage.hold_embeddings:
            vectors = [fake_vector(tokens, m.n_embd) for tokens in inputs]
            asyncio.get_running_loop().call_soon(self.embedded, request, vectors)
        return request

    def embedded(self, request: Request, vectors: list[list[float]]) -> None:
        """An embedding request's vectors (whole, as routing gives them), then its `done`
        counting its inputs' tokens."""
        if request.engine_id not in self.stage.requests:  # cancelled meanwhile
            return
        n = self.stage.admitted.index(request)
        request.is_waiting = False
        request.sink.on_embedded(request, vectors)
        num_tokens = sum(map(len, self.stage.embedded_tokens[n]))
        self.finish(request, prompt_tokens=num_tokens, completion_tokens=0)

    def _raise_queued_refusal(self) -> None:
        if self.stage.refusals:
            raise self.stage.refusals.pop(0)

    def _over_a_cap(self, user: str) -> Refusal | None:
        """Admission's refusals for room (its messages): the user's requests in flight, the
        user's waiting, everyone's waiting."""
        c, mine = self.config, [r for r in self.stage.requests.values() if r.user == user]
        if self.is_shutting_down:
            return Refusal("shutting_down", "the server is shutting down")
        if len(mine) >= c.max_inflight_per_user:
            message = f"{c.max_inflight_per_user} requests of yours are already in flight"
            return Refusal("busy", message, retry_after_s=1)
        if sum(r.is_waiting for r in mine) >= c.max_queued_per_user:
            message = f"{c.max_queued_per_user} requests of yours are already queued"
            return Refusal("busy", message, retry_after_s=1)
        if self.num_waiting >= c.max_queued:
            message = f"the queue is full ({c.max_queued} waiting); try again shortly"
            return Refusal("busy", message, retry_after_s=1)
        return None

    async def _play(self, request: Request, tokens: list[str], done: dict) -> None:
        for text in tokens:
            await asyncio.sleep(0)
            if request.engine_id not in self.stage.requests:  # cancelled meanwhile
                return
            self.token(request, text)
        await asyncio.sleep(0)
        if request.engine_id in self.stage.requests:
            self.finish(request, **({"completion_tokens": len(tokens)} | done))

    def _end_cancelled(self, request: Request) -> None:
        if request.engine_id in self.stage.requests:
            self.finish(request, "cancelled", completion_tokens=0)


def _words(text: str) -> list[int]:
    """The fake's tokenizer: a BOS (0), then a token a word (1 + its letters' sum, mod 999)."""
    return [0] + [1 + sum(w.encode()) % 999 for w in text.split()]


def fake_vector(tokens: list[int], n_embd: int) -> list[float]:
    """A deterministic L2-normalised vector of `tokens` (as the fake runner's)."""
    raw = [float((sum(tokens) * (k + 1) + k * k) % 17 + 1) for k in range(n_embd)]
    norm = sum(x * x for x in raw) ** 0.5
    return [x / norm for x in raw]


def _described(name: str, m: FakeModel) -> ModelDescription:
    """A model as the pool describes it (pool.py's ModelSlot.describe, with `waiting`)."""
    body = ModelDescription(
        name=name,
        state=m.state,
        busy=False,
        since=0.0,
        memory_mib=m.memory_mib,
        keep_alive_s=300.0,
        n_ctx=m.n_ctx,
        waiting=0,
    )
    if m.expires_at is not None:
        body["expires_at"] = m.expires_at
    return body
