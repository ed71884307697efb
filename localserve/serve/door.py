"""The seam between the server and its front-ends: the `Frontdoor` a front-end asks, and what
crosses it.

A front-end (the websocket protocol, the OpenAI, Ollama and Anthropic APIs, the page) is given
a `Frontdoor`: one model's door (model_door.py's `ModelDoor`, the same class for every model),
exactly what the front-ends use, so they never depend on the server around them. A chat goes
in as one `Submission` and, once admitted (serve/admission.py), is a `Request` whose events
go to its `Sink` (a websocket connection or an HTTP reply, routed by routing.py). A chat the
server will not take is a `Refusal` carrying the protocol's error code (docs/protocol.md),
which the websocket protocol sends as an `error` frame and the HTTP APIs map to a status; a
token check that fails is an `AuthRefusal`.

Embeddings cross the same seam, narrower: an `Embedding` (the inputs as texts or token ids,
whether one too long is cut or refused, the dimensions asked for) goes in through
`Frontdoor.embed` and, once admitted, is a `Request` like a chat's whose `EmbedSink` gets the
vectors (`on_embedded`: one per input, in order, L2-normalised, n_embd long: the sink cuts them
to the request's `dimensions`, off the loop) and then its `done` (prompt_tokens: the inputs'
tokens), through the same limits, quota and usage record as chats.

Nothing here reaches the pool, the engines or the server (the import contracts keep it so):
a front-end sees of them only what this module names.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, NotRequired, Protocol, TypedDict

from localserve.chat.constraints import ConstraintCompiler
from localserve.chat.formats import ModelFormats
from localserve.config import ServerConfig
from localserve.engine.events import Done
from localserve.engine.sampling_params import Constraint
from localserve.ops.auth import Access
from localserve.ops.quotas import Hold
from localserve.protocol.frames import SamplingFields
from localserve.serve.prompt import Prompt, PromptBuilder
from localserve.serve.trusted_proxies import People

# a client refused (or cut short) because the engine process is down may retry this soon after
RETRY_UNAVAILABLE_S = 5
# inputs in one embedding request, whatever the model allows (ModelInfo.max_embed_inputs): a
# longer list is refused before the model loads or anything is tokenized
MAX_EMBED_INPUTS = 2048
MAX_ERROR_CHARS = 200  # an error message quotes at most this much of what the client sent

# how a front-end asks for its prompt: built by the server's prompt builder, when admitted; the
# number is the reply's max_tokens when a chat too long for the context is to drop its oldest
# turns (context_overflow = "truncate"), None when it is to be refused ("refuse")
BuildPrompt = Callable[[PromptBuilder, int | None], Awaitable[Prompt]]


class Sink(Protocol):
    """Who gets a request's events: a websocket connection or an HTTP reply."""

    is_closed: bool

    def on_token(self, request: Request, text: str) -> None: ...
    def on_queued(self, request: Request, position: int, wait_s: float | None = None) -> None:
        """Its place in line (1 = next) and, once the engine predicted it, about how many
        seconds from now it enters; again whenever either changes materially."""
        ...

    def on_done(self, request: Request, done: Done) -> None: ...


class EmbedSink(Sink, Protocol):
    """Who gets an embedding request's events: its vectors, then its `done`."""

    def on_embedded(self, request: Request, vectors: list[list[float]]) -> None: ...


@dataclass(frozen=True)
class Embedding:
    """One embedding request as a front-end hands it in: who asks, under which ids, what.

    `inputs`: texts (tokenized with the model's tokenizer, its special tokens added) or token
    id lists (each id checked against the model's vocabulary), at most MAX_EMBED_INPUTS and the
    model's own bound. `truncate`: an input over the model's max_embed_tokens is cut to them
    (Ollama's default), else refused (OpenAI's). `dimensions`: the vectors cut to this many
    and renormalised (1 to the model's n_embd, else refused); None: the model's n_embd.
    The request's `dimensions` is the sink's to apply (embedding_inputs.py's `shorten`).
    `keep_alive_s` and `cancelled` as a Submission's.
    """

    sink: EmbedSink
    user: str
    client_id: str
    engine_id: str
    inputs: list[str] | list[list[int]]
    truncate: bool = False
    dimensions: int | None = None
    keep_alive_s: float | None = None
    cancelled: asyncio.Event | None = None


@dataclass(frozen=True)
class Submission:
    """One chat as a front-end hands it in: who asks, under which ids, for what.

    `response_format` (OpenAI's, the websocket chat frame's) is compiled by admission into the
    request's constraint; a caller that compiled its own (tool calling, `door.constraints`)
    passes `constraint` instead. `keep_alive_s`: the request's own keep_alive for its model
    (Ollama's field). `cancelled`: a cancel before the caller holds the request (set while
    the model loads or the prompt is built, the chat stops at once).
    """

    sink: Sink
    user: str
    client_id: str
    engine_id: str
    fields: SamplingFields
    prompt: BuildPrompt
    response_format: Any = None
    constraint: Constraint | None = None
    keep_alive_s: float | None = None
    cancelled: asyncio.Event | None = None


@dataclass(eq=False)
class Request:
    """A chat in flight: who asked, under which ids, and where its events go."""

    engine_id: str
    client_id: str
    user: str
    sink: Sink
    is_waiting: bool = True
    hold: Hold | None = None  # what it holds of its user's daily quota, until it is done
    is_recorded: bool = False  # its usage row committed when its `done` went out
    num_dropped_messages: int = 0  # the chat's oldest messages left out to fit the context
    prompt_tail: str = ""  # the rendered prompt's end (it may have opened a reasoning block)
    model: str = ""  # the model's name in models.toml
    loading: str = ""  # while its model loads: what it waits for ("loading model X", ...)
    load_ms: float = 0.0  # how long it waited for its model to load (in its TTFT)
    keep_alive_s: float | None = None  # its own keep_alive for the model (Ollama's field)
    dimensions: int | None = None  # an embedding request's: its vectors cut to this many
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


class ModelDescription(TypedDict):
    """A configured model's state as /healthz, the model lists and the picker show it."""

    name: str
    state: str  # unloaded | loading | loaded | failed
    busy: bool  # loaded with requests in flight
    since: float  # time.time() the state (or idleness) began
    memory_mib: float | None  # its memory need (None: unknown)
    keep_alive_s: float  # idle seconds before it is unloaded; < 0 = never
    n_ctx: int
    waiting: int  # requests waiting for it to load
    reason: NotRequired[str]  # why it failed, or what its load waits for
    expires_at: NotRequired[float]  # time.time() it unloads, idle
    yielding_to: NotRequired[str]  # the model whose load its new requests wait for


class ModelOption(ModelDescription):
    """A model's state and what choosing it now costs (pool.py's `Choice`)."""

    swap: list[str]  # the loaded models its load would unload
    swap_waits: bool  # some of those are busy: the load waits for their requests
    too_big: bool  # it needs more than the whole memory budget
    load_s: float | None  # about how long its load takes (None: loaded, or unknown)
    load_s_from: str  # "last_load" | "estimate" | ""


class PullProgress(TypedDict, total=False):
    """One of Ollama's pull progress objects (serve/pulling.py), as `/api/pull` streams them."""

    status: str  # pulling manifest | pulling <digest> | verifying sha256 digest | ... | success
    digest: str  # the file being fetched: "sha256:..."
    total: int  # its bytes
    completed: int  # its bytes here so far
    error: str  # the pull failed: why (the last object)


class Frontdoor(Protocol):
    """What a front-end may ask of the server, through one model's door."""

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
        constraint it gives goes in a Submission's `constraint`."""
        ...

    @property
    def model_name(self) -> str:
        """The model this door serves."""
        ...

    @property
    def model_names(self) -> list[str]:
        """Every configured model, the default first."""
        ...

    def model(self, name: str | None) -> Frontdoor:
        """The door of the model `name` (None: the default); UnknownModel (a ValueError) naming
        the configured models."""
        ...

    def describe_models(self) -> list[ModelDescription]:
        """Every model's state (pool.py's ModelSlot.describe), the default first."""
        ...

    async def model_choices(self) -> list[ModelOption]:
        """describe_models, each with what choosing it now costs (pool.py's `Choice`: the
        models its load would unload, about how long it takes)."""
        ...

    async def loaded_prompts(self) -> PromptBuilder:
        """This model's prompt builder, loading the model if it is not (Refusal when it
        cannot be loaded): a prompt rendered and counted without generating."""
        ...

    def pull(self, spec: str, name: str | None) -> AsyncIterator[PullProgress]:
        """The operator's pull (the caller checked the credential): `spec` fetched from the
        Hugging Face Hub as `localserve pull` does, its entry (`name`, else from the repo)
        added to the server's models.toml and the model to the pool; progress objects, the last
        `{"status": "success"}` or `{"error": ...}`."""
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
    ) -> AuthRefusal | None:
        """None when a token check passed; else why not (its refusal, or the throttle's)."""
        ...

    def next_number(self) -> int:
        """A number no other connection or HTTP request of this server has."""
        ...

    def is_in_flight(self, engine_id: str) -> bool: ...

    async def submit(self, submission: Submission) -> Request | None:
        """Admit the chat to this model: limits, quota, sampling values, its model loaded, its
        prompt built, the engine. Raises Refusal (busy, shutting_down, too_long, bad_request,
        quota_exceeded, unavailable); None when its sink closed meanwhile (nothing queued)."""
        ...

    async def embed(self, embedding: Embedding) -> Request | None:
        """Admit an embedding request to this model: the same limits, quota (the hold: its
        inputs' tokens), model load and engine as a chat's, its inputs tokenized and bounded.
        Raises Refusal (busy, shutting_down, bad_request naming the input or field, too_long
        naming the input, its tokens and the bound, quota_exceeded, unavailable); None when its
        sink closed meanwhile."""
        ...

    def cancel(self, request: Request) -> None:
        """Cancel at the engine's next step; its `done` still comes."""
        ...
