"""The picture of the moment that ends every diagnosis, and the healthy headline.

Tested in tests/unit/tui/diagnosis/test_diagnosis.py.
"""

from __future__ import annotations

from tui.diagnosis.signals import Signals
from tui.diagnosis.thresholds import COUNTER_WINDOW_S, DETAIL_MAX
from tui.format import clip, duration, pct, plural, size_of, span


def summary(c: Signals) -> str:
    """What runs now, in a few words: the healthy headline."""
    parts = []
    if c.running:
        parts.append(f"{c.decoding} streaming")
        if c.prefilling:
            parts.append(f"{c.prefilling} prefilling")
    else:
        parts.append("nothing running")
    if c.waiting:
        parts.append(f"{c.waiting} queued")
    parts.append(f"TTFT p50 {duration(c.ttft_p50)}")
    parts.append(f"ITL p50 {duration(c.itl_p50)}")
    if c.kv_share is not None:
        parts.append(f"KV {pct(c.kv_share)}")
    return ", ".join(parts)


def now_lines(c: Signals) -> list[str]:
    """Running and waiting, the latency windows, KV cells and the prefix cache."""
    s = c.now
    lines = [
        f"now: {c.running} running ({c.decoding} decoding, {c.prefilling} "
        f"prefilling) of {s.max_num_seqs} slots, {c.waiting} waiting"
        + (f" (oldest {duration(c.max_wait)})" if c.waiting else ""),
        f"latency over {s.window_s:.0f} s: TTFT p50 {duration(c.ttft_p50)} "
        f"p90 {duration(c.ttft_p90)}, queue p50 {duration(c.queue_p50)}, "
        f"ITL p50 {duration(c.itl_p50)} p90 {duration(c.itl_p90)} "
        f"(target {duration(c.target)})",
    ]
    kv = f"KV {pct(c.kv_share)} committed" if c.kv_share is not None else "KV unknown"
    lines.append(
        f"{kv} ({c.kv_live:,} of {s.kv_total:,} cells, {c.kv_live_used:,} used); "
        f"{s.generation_tokens_per_s:.0f} tokens/s generated, "
        f"{s.prompt_tokens_per_s:.0f} prompt tokens/s"
    )
    return lines + prefix_lines(c) + tier_lines(c)


def prefix_lines(c: Signals) -> list[str]:
    """How much the prefix cache served lately and what it holds (nothing when unused)."""
    s = c.now
    if not (c.prefix_hits or c.kv_cached or s.cached_prefixes > 0):
        return []
    held = f"{c.kv_cached:,} cells cached in {plural(s.cached_prefixes, 'prefix', 'es')}"
    when = span(c.prefix_span, COUNTER_WINDOW_S)
    if c.prefix_hits:
        share = min(1.0, c.reused_tokens / c.prompt_tokens) if c.prompt_tokens else None
        line = (
            f"prefix cache: {pct(share)} of prompt tokens reused {when} "
            f"({plural(c.prefix_hits, 'hit')}); {held}"
        )
    else:
        line = f"prefix cache: {held}, no reuse {when}"
    if c.prefix_evictions:
        line += f"; {plural(c.prefix_evictions, 'prefix', 'es')} evicted to make room"
        line += " (kept in host memory)" if c.host_keeps else ""
    return [line]


def tier_lines(c: Signals) -> list[str]:
    """What the prefix cache's tiers below the cells hold, and what their restores gave back
    lately (nothing when they are off)."""
    parts = []
    for name, tier in (("host memory", c.host_tier), ("disk", c.disk_tier)):
        if tier.enabled:
            size = size_of(tier.bytes, tier.budget_bytes)
            parts.append(f"{name} {size} in {plural(tier.entries, 'prefix', 'es')}")
        elif tier.problem:
            parts.append(f"disk off: {tier.problem}")
    if not parts:
        return []
    line = "saved prefixes: " + ", ".join(parts[:1])
    if c.restores:
        line += (
            f"; {plural(c.restores, 'restore')} gave back {c.restored_tokens:,} tokens "
            f"{span(c.restore_span, COUNTER_WINDOW_S)}"
        )
        line += f" ({c.disk_restores:,} from disk)" if c.disk_restores else ""
    line += "".join(f"; {part}" for part in parts[1:])  # the disk last: its problem may be long
    return [clip(line, DETAIL_MAX)]
