"""`/metrics`: a Snapshot in Prometheus text format, with vLLM-like names and buckets.

Names carry the `localserve:` prefix as vLLM's carry `vllm:`; the only label is the model name
(never the user: unbounded cardinality, and a privacy leak).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from localserve.protocol import Counters, Snapshot

PREFIX = "localserve:"

HISTOGRAMS = {
    "time_to_first_token_seconds": "Time to first token (arrival to first token).",
    "inter_token_latency_seconds": "Gap between successive tokens of a request.",
    "request_queue_time_seconds": "Time waiting before first admission.",
    "e2e_request_latency_seconds": "Arrival to finish.",
    "request_time_per_output_token_seconds": "Mean inter-token gap of a finished request.",
}


# name, type, help, value: what each metric reads from a snapshot and the server's auth counts.
# vLLM counts cached blocks nobody uses as free: usage is what live sequences hold, so a cache
# kept full of reusable prefixes does not read as 100%.
METRICS: list[tuple[str, str, str, Callable[[Snapshot, Counters, AuthCounts], float]]] = [
    ("num_requests_running", "gauge", "Sequences in the running batch.",
     lambda s, c, a: s.running),
    ("num_requests_waiting", "gauge", "Requests waiting for admission.",
     lambda s, c, a: s.waiting),
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
    ("prefix_cache_hit_tokens_total", "counter", "Prompt tokens reused from a cache.",
     lambda s, c, a: c.cached_tokens),
    ("prefix_cache_hits_total", "counter", "Requests that reused a cached prefix.",
     lambda s, c, a: c.prefix_hits),
    ("prefix_cache_evictions_total", "counter", "Cached prefixes evicted to make room.",
     lambda s, c, a: c.prefix_evictions),
    ("num_preemptions_total", "counter", "Sequences preempted for KV cells.",
     lambda s, c, a: c.preemptions),
    ("request_success_total", "counter", "Requests finished with stop or length.",
     lambda s, c, a: c.finished - c.cancellations - c.errors),
    ("request_cancelled_total", "counter", "Requests cancelled.",
     lambda s, c, a: c.cancellations),
    ("request_rejected_total", "counter", "Requests turned away (busy, too long, ...).",
     lambda s, c, a: c.rejections),
    ("request_errors_total", "counter", "Requests failed by the engine.",
     lambda s, c, a: c.errors),
    ("engine_steps_total", "counter", "Engine iterations.",
     lambda s, c, a: c.steps),
    ("auth_failures_total", "counter", "Failed authentications (hello, subscribe, /metrics).",
     lambda s, c, a: a.failures),
    ("auth_throttled_total", "counter",
     "Authentications refused whatever the token: too many failures from the address.",
     lambda s, c, a: a.throttled),
]  # fmt: skip


class AuthCounts(NamedTuple):
    failures: int = 0
    throttled: int = 0


def render(snap: Snapshot, auth_failures: int = 0, auth_throttled: int = 0) -> str:
    """The whole exposition, ending with a newline (the auth counts are the server's)."""
    label = f'model_name="{_escape(snap.model.model)}"'
    auth = AuthCounts(auth_failures, auth_throttled)
    out: list[str] = []
    for name, kind, help_text, value in METRICS:
        out.append(f"# HELP {PREFIX}{name} {help_text}")
        out.append(f"# TYPE {PREFIX}{name} {kind}")
        out.append(f"{PREFIX}{name}{{{label}}} {_number(value(snap, snap.counters, auth))}")
    for name, help_text in HISTOGRAMS.items():
        out += _histogram(name, help_text, label, snap.histograms[name])
    return "\n".join(out) + "\n"


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
