"""Wire types shared by the server, the clients and the monitor (a leaf module: msgspec only).

For now: the stats snapshot the engine produces, which the server sends to the monitor as
`stats` frames and renders as Prometheus text on `/metrics`. Times are in seconds, NaN when
there is nothing to measure yet.
"""

from __future__ import annotations

import msgspec


class ModelInfo(msgspec.Struct, frozen=True):
    """What the monitor's header shows about the model and the backend."""

    model: str
    backend: str  # "CPU", "CUDA", ...
    n_ctx: int  # KV cells in the unified cache
    n_seq_max: int
    n_batch: int
    n_vocab: int
    n_layer: int
    n_gpu_layers: int  # layers offloaded to the accelerator
    n_threads: int
    chat_template: str


class Percentiles(msgspec.Struct):
    p50: float
    p90: float
    p99: float
    mean: float
    count: int


class Histogram(msgspec.Struct):
    """Cumulative since start, Prometheus style: counts[i] observations <= buckets[i]."""

    buckets: list[float]
    counts: list[int]
    sum: float
    count: int


class SeqRow(msgspec.Struct):
    request_id: str
    user: str
    phase: str  # "prefill" or "decode"
    prompt_tokens: int
    computed_tokens: int  # tokens whose KV is in the cache
    output_tokens: int
    cells: int  # cells committed to it
    tokens_per_s: float
    ttft_s: float
    last_itl_s: float
    since_last_token_s: float
    num_preemptions: int


class WaitingRow(msgspec.Struct):
    position: int
    request_id: str
    user: str
    prompt_tokens: int
    waited_s: float
    is_preempted: bool


class StepStats(msgspec.Struct):
    """Averages over the recent steps."""

    num_steps: int
    step_s: float  # mean wall time of a step
    decode_tokens: float  # mean decode tokens per step
    prefill_tokens: float  # mean prefill tokens per step
    prefill_time_share: float  # share of step time predicted for prefill work
    engine_share: float  # share of step time outside llama_decode (Python + sampling)
    prefill_budget: int  # the adaptive budget of the last step


class Counters(msgspec.Struct):
    requests: int = 0  # admitted into the engine
    finished: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefill_tokens: int = 0  # computed, recompute after preemption included
    cached_tokens: int = 0  # prompt tokens reused from a cached prefix
    preemptions: int = 0
    cancellations: int = 0
    rejections: int = 0
    errors: int = 0
    steps: int = 0


class EventRow(msgspec.Struct):
    t: float  # seconds since the engine started
    kind: str
    request_id: str
    user: str
    detail: str = ""


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
    kv_used: int
    kv_committed: int
    kv_total: int
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
