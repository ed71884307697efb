"""The engine's snapshot schema: what the engine says about itself (a leaf module: msgspec only).

Times in seconds; null where there is nothing to measure yet. The websocket `stats` frame
(localserve.protocol.frames) carries it.

Tested in tests/unit/protocol/test_frames.py and tests/unit/tui/test_monitor.py.
"""

from __future__ import annotations

import msgspec


class Device(msgspec.Struct, frozen=True):
    """A device holding part of the model: this machine's CPU or GPU, or an RPC worker's."""

    name: str  # llama.cpp's device name: CPU, CUDA0, RPC1 (an RPC worker's: see endpoint)
    description: str
    layers: int  # repeating layers placed on it (the output layer not counted)
    kv_mib: float  # its share of the KV cache (a layer's cells live with the layer)
    endpoint: str = ""  # an RPC worker's host:port

    @property
    def label(self) -> str:
        """The device as a person tells it apart: "CPU", "CUDA0", "RPC1 10.0.0.2:50052"."""
        return f"{self.name} {self.endpoint}" if self.endpoint else self.name


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
    max_draft_rows: int = 0  # logit rows a step may add for drafts (0: no speculative decoding)
    devices: tuple[Device, ...] = ()  # where the layers are (empty: all on the CPU)
    # embeddings (localserve.engine.embedding): the vectors' length, how they are pooled
    # (mean | cls | last), whether the model serves embeddings only (no chats), the largest
    # input (tokens) and request (inputs) taken, and the inputs one step embeds at most
    n_embd: int = 0
    pooling: str = "mean"
    is_embedding_only: bool = False
    max_embed_tokens: int = 512
    max_embed_inputs: int = 2048
    max_embed_step_inputs: int = 64


class Percentiles(msgspec.Struct):
    """None while the window is empty."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None
    count: int


NO_VALUES = Percentiles(None, None, None, None, 0)


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
    # a restored prefix (localserve.engine.prefix_tiers): the tokens whose KV state was copied
    # back into its cells at its latest admission instead of prefilled, and the tier they came
    # from ("host" or "disk"; "" and 0: no restore, or a frame from an older server)
    restored_tokens: int = 0
    restored_from: str = ""


class WaitingRow(msgspec.Struct):
    position: int  # 1 = next to be admitted
    request_id: str
    client_id: str
    user: str
    prompt_tokens: int
    waited_s: float
    is_preempted: bool
    # the latest predicted wait from now (localserve.engine.waits); None: not predicted yet
    predicted_wait_s: float | None = None


class EmbeddingRow(msgspec.Struct):
    """An embedding request in the engine: waiting (none of its inputs embedded yet) or
    running."""

    request_id: str
    client_id: str
    user: str
    phase: str  # "waiting" or "running"
    inputs: int
    inputs_done: int
    tokens: int
    tokens_done: int
    waited_s: float  # since it arrived


class StepStats(msgspec.Struct):
    """Averages over the recent steps."""

    num_steps: int
    step_s: float | None  # mean wall time of a step; None before the first step
    decode_tokens: float | None  # mean decode tokens per step
    prefill_tokens: float | None  # mean prefill tokens per step
    prefill_time_share: float | None  # share of step time predicted for prefill work
    engine_share: float | None  # share of step time outside llama_decode (Python + sampling)
    prefill_budget: int  # the adaptive budget of the last step
    # speculative decoding over the same steps: mean draft rows per step, the share of draft
    # tokens accepted (None: no drafts), tokens generated per decode row (1 without drafts)
    draft_tokens: float | None = None
    draft_acceptance: float | None = None
    tokens_per_decode: float | None = None
    # the share of those steps' time in steps the TTFT target stretched past the ITL target's
    # prefill budget
    stretched_share: float = 0.0
    # the median ratio of the recent steps' times to the fastest of their shape in the last ten
    # minutes (engine/slowdown.py): well above 1, the machine is doing other work
    slowdown: float | None = None


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
    # speculative decoding (vLLM's spec_decode series): decode rows that carried a draft, the
    # draft tokens verified, those accepted, and accepted by position in the draft (0 first)
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_position: list[int] = msgspec.field(default_factory=list)
    # embedding requests, their own kind (not in the counts above): finished with all their
    # vectors, inputs and tokens embedded, cancelled, failed
    embed_requests: int = 0
    embed_inputs: int = 0
    embed_tokens: int = 0
    embed_cancellations: int = 0
    embed_errors: int = 0


class PrefixTier(msgspec.Struct):
    """A tier of the prefix cache below the KV cells (localserve.engine.prefix_tiers): host
    memory, or the disk behind it. Occupancy now, counters since the engine started; off and
    zero in frames from older servers."""

    enabled: bool = False  # on and usable
    problem: str = ""  # why it is off although it was asked for (the disk's); "" otherwise
    entries: int = 0  # saved prefixes it holds
    bytes: int = 0  # their KV state's size
    budget_bytes: int = 0  # what it may hold
    hits: int = 0  # restores whose KV state came from it (the engine counts them)
    restored_tokens: int = 0  # tokens those restores gave back (not prefilled)
    restored_bytes: int = 0  # KV state they copied back into the cells
    saved: int = 0  # prefixes written into it
    saved_bytes: int = 0
    evictions: int = 0  # prefixes that left it for room
    failures: int = 0  # saves, writes or restores that failed (the tokens were prefilled)


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


class RunningStep(msgspec.Struct):
    """The engine step that was running when a snapshot was given from the last one (the
    engine, busy in that step, could not answer)."""

    running_s: float  # how long it has run
    decode_tokens: int  # what it carries (0 and 0: not scheduled yet, or nothing to compute)
    prefill_tokens: int
    expected_s: float  # how long it is expected to take (engine_process/step_clock.py)
    limit_s: float  # when the watchdog stops the engine process


class HostLoad(msgspec.Struct):
    """The machine around the engine process (engine_process/child.py), when it can be read."""

    cpus: int  # the cores this process may run on
    load_1m: float  # the system's one-minute load average: runnable threads, ours included
    own_cores: float  # cores the engine process kept busy since the last snapshot

    @property
    def others(self) -> float:
        """Cores' worth of runnable threads that are not this engine's."""
        return max(0.0, self.load_1m - self.own_cores)


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
    # set when the engine was busy in a step: this is the last snapshot it gave, and that step
    step: RunningStep | None = None
    # the predicted wait's error, of requests that waited in the last ten windows: seconds off,
    # and the share of the actual wait (engine/metrics.py); what a newcomer would wait now
    queue_error: Percentiles = msgspec.field(
        default_factory=lambda: Percentiles(None, None, None, None, 0)
    )
    queue_error_share: Percentiles = msgspec.field(
        default_factory=lambda: Percentiles(None, None, None, None, 0)
    )
    newcomer_wait_s: float | None = None
    ttft_target_s: float = 0.0  # the scheduler's TTFT target (it may stretch steps for it)
    host: HostLoad | None = None  # None: not measured (an engine in the server's own process)
    # embedding work, its own kind: requests waiting and running, and what the recent steps
    # embedded per second (inputs, tokens)
    embeddings: list[EmbeddingRow] = msgspec.field(default_factory=list)
    embed_inputs_per_s: float = 0.0
    embed_tokens_per_s: float = 0.0
    # the prefix cache's tiers below the cells: host memory and the disk (off: PrefixTier())
    host_tier: PrefixTier = msgspec.field(default_factory=PrefixTier)
    disk_tier: PrefixTier = msgspec.field(default_factory=PrefixTier)
