"""Wire types shared by the server, the clients and the monitor (a leaf module: msgspec only).

JSON text frames over one websocket, tagged by `type` (docs/protocol.md has the whole contract
and an example exchange). Client frames form a closed tagged union decoded by one reused
decoder; anything else is a `bad_request`. The `stats` frame carries the engine's `Snapshot`
(times in seconds; null where there is nothing to measure yet).
"""

from __future__ import annotations

from typing import Annotated

import msgspec


class Device(msgspec.Struct, frozen=True):
    """A device holding part of the model: this machine's CPU or GPU, or an RPC worker's."""

    name: str  # llama.cpp's device name: CPU, CUDA0, RPC1 (an RPC worker's: see endpoint)
    description: str
    layers: int  # repeating layers placed on it (the output layer not counted)
    kv_mib: float  # its share of the KV cache (a layer's cells live with the layer)
    endpoint: str = ""  # an RPC worker's host:port


class ModelInfo(msgspec.Struct, frozen=True):
    """What the monitor's header shows about the model and the backend."""

    model: str
    backend: str  # "CPU", "CUDA", ...
    n_ctx: int  # KV cells in the unified cache
    n_seq_max: int  # llama.cpp sequence ids: running sequences plus cached prefixes
    n_batch: int
    n_vocab: int
    n_layer: int
    n_gpu_layers: int  # layers offloaded to the accelerator
    n_threads: int
    chat_template: str
    max_num_seqs: int = 0  # sequences decoded together (0 in frames from older servers)
    devices: tuple[Device, ...] = ()  # where the layers are (empty: all on the CPU)


class Percentiles(msgspec.Struct):
    """None while the window is empty."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None
    count: int


class Histogram(msgspec.Struct):
    """Cumulative since start, Prometheus style: counts[i] observations <= buckets[i]."""

    buckets: list[float]
    counts: list[int]
    sum: float
    count: int


class SeqRow(msgspec.Struct):
    request_id: str  # the engine's
    client_id: str  # the id its client gave it
    user: str
    phase: str  # "prefill" or "decode"
    prompt_tokens: int
    computed_tokens: int  # tokens whose KV is in the cache
    output_tokens: int
    cells: int  # cells committed to it
    own_cells: int  # of those, the ones it does not share with a cached system prompt
    own_computed: int  # of its computed tokens, the ones in its own cells
    cached_tokens: int  # prompt tokens it reused from a cached prefix at admission
    tokens_per_s: float | None  # None until there is something to measure
    ttft_s: float | None
    last_itl_s: float | None
    since_last_token_s: float | None
    num_preemptions: int


class WaitingRow(msgspec.Struct):
    position: int  # 1 = next to be admitted
    request_id: str
    client_id: str
    user: str
    prompt_tokens: int
    waited_s: float
    is_preempted: bool


class StepStats(msgspec.Struct):
    """Averages over the recent steps."""

    num_steps: int
    step_s: float | None  # mean wall time of a step; None before the first step
    decode_tokens: float | None  # mean decode tokens per step
    prefill_tokens: float | None  # mean prefill tokens per step
    prefill_time_share: float | None  # share of step time predicted for prefill work
    engine_share: float | None  # share of step time outside llama_decode (Python + sampling)
    prefill_budget: int  # the adaptive budget of the last step


class Counters(msgspec.Struct):
    requests: int = 0  # admitted into the engine
    finished: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefill_tokens: int = 0  # computed, recompute after preemption included
    cached_tokens: int = 0  # prompt tokens reused from a cached prefix (first admissions)
    prefix_hits: int = 0  # admissions that reused a cached prefix
    prefix_evictions: int = 0  # cached prefixes dropped to make room
    preemptions: int = 0
    cancellations: int = 0
    rejections: int = 0
    errors: int = 0
    steps: int = 0
    # added later (0 in frames from older servers): finishes by reason (with cancellations and
    # errors they add up to `finished`), and prompt tokens looked up in the prefix cache
    finished_stop: int = 0
    finished_length: int = 0
    prefix_cache_queries: int = 0  # prompt tokens of first admissions, while prefix caching is on


class EventRow(msgspec.Struct):
    t: float  # seconds since the engine started
    kind: str
    request_id: str
    user: str
    detail: str = ""


class Worker(msgspec.Struct):
    """An RPC worker the model is split across, as the server last found it."""

    endpoint: str  # host:port
    up: bool
    detail: str = ""  # why not: "connection refused", "not answering", ...


class Snapshot(msgspec.Struct):
    """One look at the engine: what the monitor shows and `/metrics` exports."""

    uptime_s: float
    model: ModelInfo
    policy: str
    max_num_seqs: int
    max_num_batched_tokens: int
    itl_target_s: float
    running: int
    waiting: int
    kv_used: int  # cells holding computed tokens; a cell shared by sequences counts once
    kv_committed: int  # used plus cells promised to admitted prompts
    kv_total: int
    kv_cached: int  # of kv_used: cells only cached prefixes hold (evicted first, on demand)
    kv_live: int  # committed minus cached: what live sequences hold or are promised
    kv_live_used: int  # used minus cached: computed cells live sequences hold
    cached_prefixes: int  # finished conversations and system prompts kept in the cache
    free_seq_ids: int
    window_s: float
    ttft: Percentiles
    itl: Percentiles
    queue: Percentiles
    e2e: Percentiles
    tpot: Percentiles
    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    steps: StepStats
    counters: Counters
    seqs: list[SeqRow]
    waiting_seqs: list[WaitingRow]
    events: list[EventRow]
    histograms: dict[str, Histogram]
    # the engine process: "" while it serves; else why it does not (a worker gone, restarting)
    engine_problem: str = ""
    workers: list[Worker] = msgspec.field(default_factory=list)  # the model's RPC workers


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


class Usage(msgspec.Struct):
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
    usage: Usage
    timings: Timings
    recorded: bool = True  # its usage row committed (older servers: always claimed)


class Error(msgspec.Struct, tag="error", omit_defaults=True):
    code: (
        str  # bad_request | unauthorized | busy | quota_exceeded | too_long | unknown_id |
        # shutting_down | unavailable | internal
    )
    message: str
    id: str | None = None


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
