"""`/metrics`: a Snapshot in Prometheus text format, with vLLM's names, meanings and buckets.

Names carry the `localserve:` prefix as vLLM's carry `vllm:`, so a dashboard made for vLLM works
once its prefix is changed (docs/grafana/localserve.json is one). Every series has the model
name as a label; `request_success_total` also has `finished_reason`, the prefix cache's tiers
`tier` (host, disk). Never the user: unbounded cardinality, and a privacy leak.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from localserve.protocol.snapshot import Counters, PrefixTier, Snapshot

PREFIX = "localserve:"

HISTOGRAMS = {
    "time_to_first_token_seconds": "Time to first token (arrival to first token).",
    "inter_token_latency_seconds": "Gap between successive tokens of a request.",
    "request_queue_time_seconds": "Time waiting before first admission.",
    "request_queue_time_prediction_error_seconds": "|Predicted - actual| wait of a queued request.",
    "e2e_request_latency_seconds": "Arrival to finish.",
    "request_time_per_output_token_seconds": "Mean inter-token gap of a finished request.",
    "request_prefill_time_seconds": "First admission to first token of a finished request.",
    "request_decode_time_seconds": "First to last token of a finished request.",
    "request_inference_time_seconds": "First admission to last token of a finished request.",
    "request_prompt_tokens": "Prompt tokens of a finished request.",
    "request_generation_tokens": "Tokens generated for a finished request.",
    "request_params_max_tokens": "The max_tokens parameter of a finished request.",
    "request_max_num_generation_tokens": "Most tokens a finished request asked for (max_tokens).",
    "iteration_tokens_total": "Tokens computed per engine step (prefill and decode).",
}

# vLLM's finished_reason values, each localserve finish reason under one (docs/metrics.md):
# a cancelled request (by its client, a disconnect or a shutdown) is vLLM's "abort". Every value
# is always exported, zeros included, so the series exist before the first such finish.
FINISHED_REASONS: dict[str, Callable[[Counters], int]] = {
    "stop": lambda c: c.finished_stop,
    "length": lambda c: c.finished_length,
    "abort": lambda c: c.cancellations,
    "error": lambda c: c.errors,
}


# name, type, help, value: what each metric reads from a snapshot and the server's auth counts.
# vLLM counts cached blocks nobody uses as free: usage is what live sequences hold, so a cache
# kept full of reusable prefixes does not read as 100%.
METRICS: list[tuple[str, str, str, Callable[[Snapshot, Counters, AuthCounts], float]]] = [
    ("num_requests_running", "gauge", "Sequences in the running batch.",
     lambda s, c, a: s.running),
    ("num_requests_waiting", "gauge", "Requests waiting for admission.",
     lambda s, c, a: s.waiting),
    ("newcomer_wait_seconds", "gauge",
     "Predicted wait of a newcomer's median prompt arriving now (-1: not predictable).",
     lambda s, c, a: -1.0 if s.newcomer_wait_s is None else s.newcomer_wait_s),
    ("queue_time_prediction_error_ratio", "gauge",
     "Median of |predicted - actual| / actual queue time, of recent requests that waited.",
     lambda s, c, a: s.queue_error_share.p50 or 0.0),
    ("kv_cache_usage_perc", "gauge",
     "KV cells live sequences hold, as a fraction of all cells (cached prefixes excluded).",
     lambda s, c, a: s.kv_live_used / max(s.kv_total, 1)),
    ("kv_cache_used_cells", "gauge", "KV cells holding computed tokens, cached prefixes included.",
     lambda s, c, a: s.kv_used),
    ("kv_cache_cached_cells", "gauge", "KV cells only cached prefixes hold (evicted on demand).",
     lambda s, c, a: s.kv_cached),
    ("kv_cache_committed_cells", "gauge", "KV cells used or promised to admitted prompts.",
     lambda s, c, a: s.kv_committed),
    ("kv_cache_total_cells", "gauge", "KV cells in the unified cache.",
     lambda s, c, a: s.kv_total),
    ("prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
     lambda s, c, a: c.prompt_tokens),
    ("generation_tokens_total", "counter", "Generated tokens.",
     lambda s, c, a: c.generation_tokens),
    ("prefill_tokens_total", "counter", "Prompt tokens computed, recompute included.",
     lambda s, c, a: c.prefill_tokens),
    ("prefix_cache_entries", "gauge", "Cached prefixes kept for reuse.",
     lambda s, c, a: s.cached_prefixes),
    ("prefix_cache_queries_total", "counter",
     "Prefix cache queries, in tokens: prompt tokens of admitted requests, looked up.",
     lambda s, c, a: c.prefix_cache_queries),
    ("prefix_cache_hits_total", "counter",
     "Prefix cache hits, in tokens: prompt tokens reused from a cached prefix.",
     lambda s, c, a: c.cached_tokens),
    ("prefix_cache_hit_tokens_total", "counter",
     "Prompt tokens reused from a cache (the same as prefix_cache_hits_total).",
     lambda s, c, a: c.cached_tokens),
    ("prefix_cache_hit_requests_total", "counter", "Requests that reused a cached prefix.",
     lambda s, c, a: c.prefix_hits),
    ("prefix_cache_evictions_total", "counter", "Cached prefixes evicted to make room.",
     lambda s, c, a: c.prefix_evictions),
    ("num_preemptions_total", "counter", "Sequences preempted for KV cells.",
     lambda s, c, a: c.preemptions),
    ("request_cancelled_total", "counter", "Requests cancelled.",
     lambda s, c, a: c.cancellations),
    ("request_rejected_total", "counter", "Requests turned away (busy, too long, ...).",
     lambda s, c, a: c.rejections),
    ("request_errors_total", "counter", "Requests failed by the engine.",
     lambda s, c, a: c.errors),
    ("engine_steps_total", "counter", "Engine iterations.",
     lambda s, c, a: c.steps),
    ("spec_decode_num_drafts_total", "counter",
     "Speculative decoding: decode rows that carried a draft.",
     lambda s, c, a: c.spec_drafts),
    ("spec_decode_num_draft_tokens_total", "counter",
     "Speculative decoding: draft tokens verified.",
     lambda s, c, a: c.spec_draft_tokens),
    ("spec_decode_num_accepted_tokens_total", "counter",
     "Speculative decoding: draft tokens accepted.",
     lambda s, c, a: c.spec_accepted_tokens),
    ("embedding_requests_total", "counter",
     "Embedding requests finished with all their vectors.",
     lambda s, c, a: c.embed_requests),
    ("embedding_inputs_total", "counter", "Embedding inputs embedded.",
     lambda s, c, a: c.embed_inputs),
    ("embedding_tokens_total", "counter", "Tokens of the embedding inputs embedded.",
     lambda s, c, a: c.embed_tokens),
    ("embedding_cancelled_total", "counter", "Embedding requests cancelled.",
     lambda s, c, a: c.embed_cancellations),
    ("embedding_errors_total", "counter", "Embedding requests failed by the engine.",
     lambda s, c, a: c.embed_errors),
    ("num_embedding_requests_running", "gauge",
     "Embedding requests with inputs embedded or in the step.",
     lambda s, c, a: sum(e.phase == "running" for e in s.embeddings)),
    ("num_embedding_requests_waiting", "gauge",
     "Embedding requests none of whose inputs ran yet.",
     lambda s, c, a: sum(e.phase == "waiting" for e in s.embeddings)),
    ("auth_failures_total", "counter", "Failed authentications (hello, subscribe, /metrics).",
     lambda s, c, a: a.failures),
    ("auth_throttled_total", "counter",
     "Authentications the throttle delayed or refused: too many failures from the address.",
     lambda s, c, a: a.throttled),
]  # fmt: skip


# the prefix cache's tiers below the KV cells, one series per tier (`tier`: host, disk), both
# always exported (zeros while off) so that a panel has its series before the first restore
TIERS: dict[str, Callable[[Snapshot], PrefixTier]] = {
    "host": lambda s: s.host_tier,
    "disk": lambda s: s.disk_tier,
}
TIER_METRICS: list[tuple[str, str, str, Callable[[PrefixTier], float]]] = [
    ("prefix_cache_tier_enabled", "gauge",
     "1 while the prefix cache's tier (host memory, disk) is on, else 0.",
     lambda t: int(t.enabled)),
    ("prefix_cache_tier_entries", "gauge", "Saved prefixes the tier holds.",
     lambda t: t.entries),
    ("prefix_cache_tier_bytes", "gauge", "Bytes of saved KV state the tier holds.",
     lambda t: t.bytes),
    ("prefix_cache_tier_budget_bytes", "gauge", "Bytes of saved KV state the tier may hold.",
     lambda t: t.budget_bytes),
    ("prefix_cache_tier_hits_total", "counter",
     "Restores whose KV state came from the tier (copied back, not prefilled).",
     lambda t: t.hits),
    ("prefix_cache_tier_restored_tokens_total", "counter",
     "Tokens restored from the tier instead of prefilled.",
     lambda t: t.restored_tokens),
    ("prefix_cache_tier_restored_bytes_total", "counter",
     "Bytes of KV state copied back into the cells from the tier.",
     lambda t: t.restored_bytes),
    ("prefix_cache_tier_saved_total", "counter", "Prefixes written into the tier.",
     lambda t: t.saved),
    ("prefix_cache_tier_saved_bytes_total", "counter", "Bytes of KV state written into the tier.",
     lambda t: t.saved_bytes),
    ("prefix_cache_tier_evictions_total", "counter", "Saved prefixes that left the tier for room.",
     lambda t: t.evictions),
    ("prefix_cache_tier_failures_total", "counter",
     "Saves, writes or restores of the tier that failed (the tokens were prefilled).",
     lambda t: t.failures),
]  # fmt: skip


class AuthCounts(NamedTuple):
    failures: int = 0
    throttled: int = 0


def render(
    snap: Snapshot | list[Snapshot],
    auth_failures: int = 0,
    auth_throttled: int = 0,
    models: list[ModelState] | None = None,
) -> str:
    """The whole exposition, ending with a newline (the auth counts are the server's).

    Several snapshots (one per loaded model) give each family one series per model, told apart
    by `model_name` as vLLM's are; the server-wide auth counts go with the first model's label.
    `models`: every configured model's state, as `localserve:model_loaded` (1 loaded, else 0,
    with `state`) and `localserve:model_memory_bytes` (its estimated need)."""
    snaps = snap if isinstance(snap, list) else [snap]
    labels = [f'model_name="{_escape(s.model.model)}"' for s in snaps]
    auth = AuthCounts(auth_failures, auth_throttled)
    out: list[str] = []
    for name, kind, help_text, value in METRICS:
        out.append(f"# HELP {PREFIX}{name} {help_text}")
        out.append(f"# TYPE {PREFIX}{name} {kind}")
        for i, (s, label) in enumerate(zip(snaps, labels, strict=True)):
            if name.startswith("auth_") and i:
                continue
            out.append(f"{PREFIX}{name}{{{label}}} {_number(value(s, s.counters, auth))}")
    success = PREFIX + "request_success_total"
    reasons = ", ".join(FINISHED_REASONS)
    out += [
        f"# HELP {success} Finished requests by finished_reason ({reasons}).",
        f"# TYPE {success} counter",
    ]
    for s, label in zip(snaps, labels, strict=True):
        for reason, count in FINISHED_REASONS.items():
            out.append(f'{success}{{{label},finished_reason="{reason}"}} {count(s.counters)}')
    out += _accepted_per_position(snaps, labels)
    out += _tiers(snaps, labels)
    for name, help_text in HISTOGRAMS.items():
        present = [(s, lb) for s, lb in zip(snaps, labels, strict=True) if name in s.histograms]
        for i, (s, label) in enumerate(present):  # an older engine's snapshot may lack some
            lines = _histogram(name, help_text, label, s.histograms[name])
            out += lines if i == 0 else lines[2:]
    out += _model_states(models or [])
    return "\n".join(out) + "\n"


def _accepted_per_position(snaps: list[Snapshot], labels: list[str]) -> list[str]:
    """vLLM's spec_decode_num_accepted_tokens_per_pos: accepted draft tokens by their position
    in the draft (0 first), one series per position drafted so far."""
    name = PREFIX + "spec_decode_num_accepted_tokens_per_pos_total"
    out = [
        f"# HELP {name} Speculative decoding: draft tokens accepted, by position in the draft.",
        f"# TYPE {name} counter",
    ]
    for s, label in zip(snaps, labels, strict=True):
        for pos, count in enumerate(s.counters.spec_accepted_per_position):
            out.append(f'{name}{{{label},position="{pos}"}} {count}')
    return out


def _tiers(snaps: list[Snapshot], labels: list[str]) -> list[str]:
    """The prefix cache's tiers: each family with one series per model and tier."""
    out = []
    for name, kind, help_text, value in TIER_METRICS:
        out += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}"]
        for s, label in zip(snaps, labels, strict=True):
            for tier, read in TIERS.items():
                out.append(f'{PREFIX}{name}{{{label},tier="{tier}"}} {_number(value(read(s)))}')
    return out


class ModelState(NamedTuple):
    """A configured model as /metrics shows it (serve/pool.py's slot)."""

    name: str
    state: str  # loaded | loading | unloaded | failed
    memory_bytes: int  # its estimated need, 0 when unknown


def _model_states(models: list[ModelState]) -> list[str]:
    if not models:
        return []
    loaded, memory = PREFIX + "model_loaded", PREFIX + "model_memory_bytes"
    out = [
        f"# HELP {loaded} 1 while the model is loaded, else 0; state: loaded, loading, "
        "unloaded or failed.",
        f"# TYPE {loaded} gauge",
    ]
    for m in models:
        label = f'model_name="{_escape(m.name)}",state="{m.state}"'
        out.append(f"{loaded}{{{label}}} {int(m.state == 'loaded')}")
    out += [
        f"# HELP {memory} The model's estimated memory need (weights, KV cache, compute).",
        f"# TYPE {memory} gauge",
    ]
    out += [f'{memory}{{model_name="{_escape(m.name)}"}} {m.memory_bytes}' for m in models]
    return out


def _histogram(name: str, help_text: str, label: str, h) -> list[str]:
    full = PREFIX + name
    lines = [f"# HELP {full} {help_text}", f"# TYPE {full} histogram"]
    for bound, count in zip(h.buckets, h.counts, strict=True):
        lines.append(f'{full}_bucket{{{label},le="{_number(bound)}"}} {count}')
    lines.append(f'{full}_bucket{{{label},le="+Inf"}} {h.count}')
    lines.append(f"{full}_sum{{{label}}} {_number(h.sum)}")
    lines.append(f"{full}_count{{{label}}} {h.count}")
    return lines


def _number(x: float) -> str:
    return repr(float(x)) if isinstance(x, float) else str(x)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
