"""Wire types shared by the server, the clients and the monitor (a leaf module: msgspec only).

JSON text frames over one websocket, tagged by `type` (docs/protocol.md has the whole contract
and an example exchange). Client frames form a closed tagged union decoded by one reused
decoder; anything else is a `bad_request`. The `stats` frame carries the engine's `Snapshot`
(times in seconds; null where there is nothing to measure yet).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from localserve.protocol.snapshot import Snapshot

# --- client -> server -------------------------------------------------------------------------

PROTOCOL_VERSION = 1
MAX_STATS_INTERVAL_MS = 3_600_000


class Hello(msgspec.Struct, tag="hello", forbid_unknown_fields=True):
    """First frame of a connection."""

    user: str
    token: str | None = None


class Message(msgspec.Struct, forbid_unknown_fields=True):
    role: str  # system | user | assistant
    content: str


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


class Cancel(msgspec.Struct, tag="cancel", forbid_unknown_fields=True):
    id: str


class Subscribe(msgspec.Struct, tag="subscribe", forbid_unknown_fields=True):
    """Periodic `stats` frames; interval_ms 0 stops them."""

    interval_ms: Annotated[int, msgspec.Meta(le=MAX_STATS_INTERVAL_MS)] = 500
    token: str | None = None  # the monitor token, when the server requires one


ClientFrame = Hello | Chat | Cancel | Subscribe


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


class Queued(msgspec.Struct, tag="queued"):
    id: str
    position: int  # 1 = next to be admitted


class TokenDelta(msgspec.Struct, tag="token"):
    id: str
    text: str  # one or more tokens' text (coalesced when the client reads slowly)


class ReplyUsage(msgspec.Struct):
    """The token counts of one reply, in its `done` frame."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class Timings(msgspec.Struct):
    queue_ms: float | None
    ttft_ms: float | None
    itl_ms: float | None
    e2e_ms: float | None


class Finished(msgspec.Struct, tag="done"):
    id: str
    finish_reason: str  # stop | length | cancelled | error
    usage: ReplyUsage
    timings: Timings
    recorded: bool = True  # its usage row committed (older servers: always claimed)


class Error(msgspec.Struct, tag="error", omit_defaults=True):
    code: (
        str  # bad_request | unauthorized | busy | quota_exceeded | too_long | unknown_id |
        # shutting_down | unavailable | internal
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


class Stats(msgspec.Struct, tag="stats"):
    snapshot: Snapshot
    usage_today: list[UserUsage] = msgspec.field(default_factory=list)  # most tokens first
    usage_problem: str = ""  # why the usage record cannot be written now ("" while it can)


ServerFrame = Welcome | Queued | TokenDelta | Finished | Error | Notice | Stats
