"""Wire types shared by the server, the clients and the monitor (a leaf module: msgspec only).

JSON text frames over one websocket, tagged by `type` (docs/protocol.md has the whole contract
and an example exchange). Client frames form a closed tagged union decoded by one reused
decoder; anything else is a `bad_request`. The `stats` frame carries the engine's `Snapshot`
(times in seconds; null where there is nothing to measure yet).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from localserve.protocol.snapshot import Snapshot

# --- client -> server -------------------------------------------------------------------------

PROTOCOL_VERSION = 1
MAX_STATS_INTERVAL_MS = 3_600_000


class Hello(msgspec.Struct, tag="hello", forbid_unknown_fields=True):
    """First frame of a connection."""

    user: str
    token: str | None = None


class WireToolCall(msgspec.Struct, forbid_unknown_fields=True):
    """A tool call: in a `done` frame (the reply's), or in an assistant message of the history."""

    id: Annotated[str, msgspec.Meta(max_length=256)]
    name: Annotated[str, msgspec.Meta(max_length=64)]
    arguments: str  # JSON text


class Message(msgspec.Struct, forbid_unknown_fields=True):
    role: str  # system | user | assistant | tool
    content: str = ""
    tool_calls: list[WireToolCall] | None = None  # an assistant message's calls
    tool_call_id: Annotated[str, msgspec.Meta(max_length=256)] | None = None  # a tool result's
    name: Annotated[str, msgspec.Meta(max_length=64)] | None = None  # the tool that answered


class SamplingFields(msgspec.Struct, kw_only=True):
    """How a reply is sampled: the one definition behind the websocket `chat` frame, the OpenAI
    API's requests and the engine's `SamplingParams` (which checks the values)."""

    max_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = msgspec.field(default_factory=list)
    ignore_eos: bool = False


SAMPLING_FIELDS = SamplingFields.__struct_fields__


class Chat(SamplingFields, tag="chat", forbid_unknown_fields=True, kw_only=True):
    """A request: a conversation to continue. `id` is the client's, unique per connection."""

    id: str
    messages: list[Message]
    # structured output, as OpenAI's: {"type": "json_object"} or {"type": "json_schema",
    # "json_schema": {"name": ..., "schema": {...}}}; checked and bounded by the server
    response_format: dict[str, Any] | None = None
    # tool calling and the thinking switch, as OpenAI's chat completions (docs/protocol.md)
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # which of the server's models answers (the welcome frame's `models`); None = the default
    model: str | None = None


class Cancel(msgspec.Struct, tag="cancel", forbid_unknown_fields=True):
    id: str


class Subscribe(msgspec.Struct, tag="subscribe", forbid_unknown_fields=True):
    """Periodic `stats` frames; interval_ms 0 stops them."""

    interval_ms: Annotated[int, msgspec.Meta(le=MAX_STATS_INTERVAL_MS)] = 500
    token: str | None = None  # the monitor token, when the server requires one
    # whose engine the snapshots show (the welcome's `models`); None = the default model's
    # (while it is unloaded, a loaded one's). A new subscribe switches an existing stream.
    model: str | None = None


class ListModels(msgspec.Struct, tag="list_models", forbid_unknown_fields=True):
    """The server's models and what choosing each costs now (answered by `models`)."""


# --- server -> client -------------------------------------------------------------------------


class Limits(msgspec.Struct):
    max_frame_bytes: int
    max_tokens: int
    max_inflight_per_user: int
    max_queued_per_user: int
    max_queued: int


class Quota(msgspec.Struct):
    """A user's daily token limit. Tokens counted: prompt tokens computed (not those reused
    from the cache) plus tokens generated, since the server's local midnight."""

    daily_tokens: int
    used_today: int
    remaining: int  # max(0, daily_tokens - used_today)
    resets_at: str  # the next local midnight, ISO 8601 with its UTC offset


class Welcome(msgspec.Struct, tag="welcome"):
    model: str
    n_ctx: int
    limits: Limits
    version: str
    protocol: int = PROTOCOL_VERSION
    backend: str = ""  # "CPU", "CUDA", ... ("" from older servers)
    quota: Quota | None = None  # this user's daily limit, when there is one
    conversations: bool = False  # the server keeps this person's conversations (see below)
    models: list[str] = msgspec.field(default_factory=list)  # every model, the default first


class Queued(msgspec.Struct, tag="queued", omit_defaults=True):
    id: str
    position: int  # 1 = next to be admitted
    # while the request's model loads: what it waits for ("loading model X", "waiting for
    # memory: X is busy"); absent once it waits for the engine only
    loading: str = ""
    # about how many seconds from now it enters, as the server predicts from its scheduler's
    # state (docs/metrics.md); absent until predicted. Sent again when the place or the
    # predicted entry moves; a client counts down in between
    wait_s: float | None = None


class TokenDelta(msgspec.Struct, tag="token", omit_defaults=True):
    id: str
    text: str  # one or more tokens' text (coalesced when the client reads slowly)
    reasoning: str = ""  # a thinking model's reasoning, split from the answer (before it)


class ReplyUsage(msgspec.Struct):
    """The token counts of one reply, in its `done` frame."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class Timings(msgspec.Struct, omit_defaults=True):
    queue_ms: float | None
    ttft_ms: float | None
    itl_ms: float | None
    e2e_ms: float | None
    load_ms: float | None = None  # its model was loaded first: this long (in the three above)
    # speculative decoding: draft tokens verified for it and those accepted (llama-server's
    # names); absent when it drafted nothing
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    # it waited for a prediction: the queue time its first prediction said (beside queue_ms)
    predicted_queue_ms: float | None = None

    @classmethod
    def of(cls, t: dict[str, float | None]) -> Timings:
        """The frame's timings from an engine `done`'s (engine/sequence.py's names)."""
        drafts = {k: int(v) for k in ("draft_n", "draft_n_accepted") if (v := t.get(k)) is not None}
        return cls(
            t["queue_ms"], t["ttft_ms"], t["itl_ms"], t["e2e_ms"], t.get("load_ms"), **drafts,
            predicted_queue_ms=t.get("predicted_queue_ms"),
        )  # fmt: skip


class Finished(msgspec.Struct, tag="done"):
    id: str
    finish_reason: str  # stop | length | cancelled | error
    usage: ReplyUsage
    timings: Timings
    recorded: bool = True  # its usage row committed (older servers: always claimed)
    # the chat's oldest messages left out so that it fit the context (context_overflow)
    dropped_messages: int = 0
    tool_calls: list[WireToolCall] = msgspec.field(default_factory=list)  # finish "tool_calls"
    model: str = ""  # the model that answered ("" from older servers)


class Error(msgspec.Struct, tag="error", omit_defaults=True):
    code: (
        str  # bad_request | unauthorized | busy | quota_exceeded | too_long | unknown_id |
        # shutting_down | unavailable | internal | not_saved | conflict (conversations)
    )
    message: str
    id: str | None = None
    retry_after_s: float | None = None  # a refusal that passes: busy, quota_exceeded, unavailable


class Notice(msgspec.Struct, tag="notice"):
    """Server news, e.g. `shutting_down` with the grace period left."""

    code: str
    message: str


class UserUsage(msgspec.Struct):
    """One user's requests since the server's local midnight (from the usage database)."""

    user: str
    requests: int
    prompt_tokens: int
    cached_tokens: int  # of prompt_tokens: reused from the cache, not computed
    completion_tokens: int
    daily_tokens: int | None = None  # the user's quota, if any

    @property
    def counted_tokens(self) -> int:
        """What a quota counts: prompt tokens computed plus tokens generated."""
        return self.prompt_tokens - self.cached_tokens + self.completion_tokens


class ModelStatus(msgspec.Struct, omit_defaults=True):
    """One configured model in the pool: its state and what waits for it."""

    name: str
    state: str  # loaded | loading | unloaded | failed
    busy: bool = False  # loaded, with requests in flight
    reason: str = ""  # why it failed, or what its load waits for ("waiting for memory: ...")
    since: float = 0.0  # seconds since the epoch: when the state (or, idle, the idleness) began
    memory_mib: float | None = None  # its estimated memory need
    waiting: int = 0  # requests waiting for it to load


class ModelChoice(msgspec.Struct):
    """One model as a person choosing it sees it (the `models` frame)."""

    name: str
    state: str  # loaded | loading | unloaded | failed
    busy: bool = False  # loaded, with requests in flight
    reason: str = ""  # why it failed, or what its load waits for ("waiting for memory: ...")
    # choosing it now would unload these loaded models to make room (a swap); [] = it fits
    swap: list[str] = msgspec.field(default_factory=list)
    swap_waits: bool = False  # some of them are busy: its load waits for their replies
    too_big: bool = False  # more than the server's whole memory budget: it cannot load
    # about how long its load takes, in seconds (None: loaded, or nothing to go by) and from
    # what: "last_load" (its own since the server started) or "estimate" (its memory need at
    # the rate of earlier loads)
    load_s: float | None = None
    load_s_from: str = ""


class ModelList(msgspec.Struct, tag="models"):
    """The answer to `list_models`: every model, the default first."""

    models: list[ModelChoice]
    default: str


class Stats(msgspec.Struct, tag="stats"):
    # the engine of the model the subscription named (snapshot.model.model says which); of the
    # default model without one (else the loaded one used last). A named model that has never
    # been loaded has no figures: its frames show the default's until it loads
    snapshot: Snapshot
    usage_today: list[UserUsage] = msgspec.field(default_factory=list)  # most tokens first
    usage_problem: str = ""  # why the usage record cannot be written now ("" while it can)
    models: list[ModelStatus] = msgspec.field(default_factory=list)  # every model, default first


# --- conversations kept on the server (a server with users; ops/conversations.py) -----------

MAX_TITLE_CHARS = 200
MAX_MESSAGES = 10_000
CONVERSATION_ID = r"^[A-Za-z0-9_-]{1,64}$"
Title = Annotated[str, msgspec.Meta(max_length=MAX_TITLE_CHARS)]
Word = Annotated[str, msgspec.Meta(max_length=32)]


class StoredMessage(msgspec.Struct, omit_defaults=True):
    """One message as the page keeps it: the text and what the page shows under a reply.
    Other fields a page sends are dropped."""

    role: Literal["user", "assistant"]
    content: str
    status: Word | None = None  # done | stopped | error | interrupted | sending | ...
    error: Annotated[str, msgspec.Meta(max_length=1000)] | None = None
    finish: Word | None = None  # the reply's finish_reason
    usage: ReplyUsage | None = None
    timings: Timings | None = None
    reasoning: str | None = None  # a thinking model's reasoning, shown folded (never resent)
    model: Annotated[str, msgspec.Meta(max_length=256)] | None = None  # the one that answered


class SavedConversation(msgspec.Struct):
    id: Annotated[str, msgspec.Meta(pattern=CONVERSATION_ID)]
    title: Title = "New chat"
    created: Annotated[int, msgspec.Meta(ge=0, le=1 << 53)] = 0  # ms since the epoch
    messages: Annotated[list[StoredMessage], msgspec.Meta(max_length=MAX_MESSAGES)] = msgspec.field(
        default_factory=list
    )
    # the model the conversation talks to (None: the server's default; older ones have none)
    model: Annotated[str, msgspec.Meta(max_length=256)] | None = None


class ListConversations(msgspec.Struct, tag="list_conversations", forbid_unknown_fields=True):
    """A page of the person's conversations (100 summaries), from `offset` on."""

    offset: Annotated[int, msgspec.Meta(ge=0)] = 0


class GetConversation(msgspec.Struct, tag="get_conversation", forbid_unknown_fields=True):
    id: str


class SaveConversation(msgspec.Struct, tag="save_conversation", forbid_unknown_fields=True):
    """Store it whole, a new one or over the one of its id. `base_revision`: the revision this
    copy was made from (None: a new conversation, or no check); when the stored one has moved on
    (another device saved it meanwhile), the save is refused with `conflict`."""

    conversation: SavedConversation
    base_revision: int | None = None


class RenameConversation(msgspec.Struct, tag="rename_conversation", forbid_unknown_fields=True):
    id: str
    title: Title


class DeleteConversation(msgspec.Struct, tag="delete_conversation", forbid_unknown_fields=True):
    id: str


class ConversationSummary(msgspec.Struct):
    id: str
    title: str
    created: int  # ms since the epoch (the page's clock)
    updated: int  # ms since the epoch (the server's clock), at the last save
    revision: int  # 1 at the first save, one more at each save or rename
    bytes: int  # what it counts against the person's bound


class ConversationList(msgspec.Struct, tag="conversation_list"):
    conversations: list[ConversationSummary]  # newest first
    used_bytes: int
    max_bytes: int  # the person's bound: [server] max_conversation_bytes_per_user
    max_count: int  # [server] max_conversations_per_user
    offset: int = 0  # this page's first summary, in the whole list
    total: int = 0  # summaries in the whole list: another page follows when offset + len < total


class ConversationFound(msgspec.Struct, tag="conversation"):
    conversation: SavedConversation
    summary: ConversationSummary


class ConversationSaved(msgspec.Struct, tag="conversation_saved"):
    """A save or rename: to the connection that asked (here) and the person's others."""

    summary: ConversationSummary
    here: bool


class ConversationDeleted(msgspec.Struct, tag="conversation_deleted"):
    id: str
    here: bool


CONVERSATION_FRAMES = (
    ListConversations,
    GetConversation,
    SaveConversation,
    RenameConversation,
    DeleteConversation,
)

ClientFrame = (
    Hello
    | Chat
    | Cancel
    | Subscribe
    | ListModels
    | ListConversations
    | GetConversation
    | SaveConversation
    | RenameConversation
    | DeleteConversation
)
ServerFrame = (
    Welcome
    | Queued
    | TokenDelta
    | Finished
    | Error
    | Notice
    | Stats
    | ModelList
    | ConversationList
    | ConversationFound
    | ConversationSaved
    | ConversationDeleted
)
