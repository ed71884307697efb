"""`/metrics`: a Snapshot in Prometheus text format, with vLLM-like names and buckets.

Names carry the `localserve:` prefix as vLLM's carry `vllm:`; the only label is the model name
(never the user: unbounded cardinality, and a privacy leak).
"""

from __future__ import annotations

from localserve.protocol import Snapshot

PREFIX = "localserve:"

HISTOGRAMS = {
    "time_to_first_token_seconds": "Time to first token (arrival to first token).",
    "inter_token_latency_seconds": "Gap between successive tokens of a request.",
    "request_queue_time_seconds": "Time waiting before first admission.",
    "e2e_request_latency_seconds": "Arrival to finish.",
    "request_time_per_output_token_seconds": "Mean inter-token gap of a finished request.",
}


def render(snap: Snapshot, auth_failures: int = 0, auth_throttled: int = 0) -> str:
    """The whole exposition, ending with a newline (the auth counts are the server's)."""
    label = f'model_name="{_escape(snap.model.model)}"'
    out: list[str] = []

    def metric(name: str, kind: str, help_text: str, value: float) -> None:
        out.append(f"# HELP {PREFIX}{name} {help_text}")
        out.append(f"# TYPE {PREFIX}{name} {kind}")
        out.append(f"{PREFIX}{name}{{{label}}} {_number(value)}")

    c = snap.counters
    metric("num_requests_running", "gauge", "Sequences in the running batch.", snap.running)
    metric("num_requests_waiting", "gauge", "Requests waiting for admission.", snap.waiting)
    # vLLM counts cached blocks nobody uses as free: usage is what live sequences hold, so a
    # cache kept full of reusable prefixes does not read as 100%
    metric("kv_cache_usage_perc", "gauge",
           "KV cells live sequences hold, as a fraction of all cells (cached prefixes excluded).",
           snap.kv_live_used / max(snap.kv_total, 1))  # fmt: skip
    metric("kv_cache_used_cells", "gauge",
           "KV cells holding computed tokens, cached prefixes included.", snap.kv_used)  # fmt: skip
    metric("kv_cache_cached_cells", "gauge",
           "KV cells only cached prefixes hold (evicted on demand).", snap.kv_cached)  # fmt: skip
    metric("kv_cache_committed_cells", "gauge", "KV cells used or promised to admitted prompts.",
           snap.kv_committed)  # fmt: skip
    metric("kv_cache_total_cells", "gauge", "KV cells in the unified cache.", snap.kv_total)
    metric("prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", c.prompt_tokens)
    metric("generation_tokens_total", "counter", "Generated tokens.", c.generation_tokens)
    metric("prefill_tokens_total", "counter", "Prompt tokens computed, recompute included.",
           c.prefill_tokens)  # fmt: skip
    metric("prefix_cache_entries", "gauge", "Cached prefixes kept for reuse.",
           snap.cached_prefixes)  # fmt: skip
    metric("prefix_cache_hit_tokens_total", "counter", "Prompt tokens reused from a cache.",
           c.cached_tokens)  # fmt: skip
    metric("prefix_cache_hits_total", "counter", "Requests that reused a cached prefix.",
           c.prefix_hits)  # fmt: skip
    metric("prefix_cache_evictions_total", "counter", "Cached prefixes evicted to make room.",
           c.prefix_evictions)  # fmt: skip
    metric("num_preemptions_total", "counter", "Sequences preempted for KV cells.", c.preemptions)
    metric("request_success_total", "counter", "Requests finished with stop or length.",
           c.finished - c.cancellations - c.errors)  # fmt: skip
    metric("request_cancelled_total", "counter", "Requests cancelled.", c.cancellations)
    metric("request_rejected_total", "counter", "Requests turned away (busy, too long, ...).",
           c.rejections)  # fmt: skip
    metric("request_errors_total", "counter", "Requests failed by the engine.", c.errors)
    metric("engine_steps_total", "counter", "Engine iterations.", c.steps)
    metric("auth_failures_total", "counter",
           "Failed authentications (hello, subscribe, /metrics).", auth_failures)  # fmt: skip
    metric("auth_throttled_total", "counter",
           "Authentications refused whatever the token: too many failures from the address.",
           auth_throttled)  # fmt: skip
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
