"""The load generator's figures: summaries of results, and their readable form.

Definitions follow vLLM's `bench serve`: TTFT = chat sent -> first token frame; ITL = gaps
between token frames of one request (a frame may carry several tokens when the client reads
slowly); TPOT = (e2e - TTFT) / (output tokens - 1); e2e = sent -> done. Throughput is counted
over the whole run; goodput is the rate of requests that met every SLO given. The conversation
workload is reported per turn: TTFT and cached prompt tokens, and the last turn against a cold
replay of it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from localserve.bench.runs import ConversationResult
from localserve.bench.targets import RequestResult
from localserve.engine.stats import percentile


@dataclass(frozen=True)
class SLO:
    """Service-level objectives in milliseconds (None = not required)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    @classmethod
    def parse(cls, text: str) -> SLO:
        """'ttft=500,tpot=100' -> SLO(ttft_ms=500, tpot_ms=100)."""
        values = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, _, value = item.partition("=")
            if key not in ("ttft", "tpot", "e2e") or not value:
                raise ValueError(f"--slo: {item!r}: expected ttft=MS, tpot=MS or e2e=MS")
            values[f"{key}_ms"] = float(value)
        return cls(**values)

    def met(self, r: RequestResult) -> bool:
        checks = [(self.ttft_ms, r.ttft), (self.tpot_ms, r.tpot), (self.e2e_ms, r.e2e)]
        return r.ok and all(
            limit is None or (value is not None and value * 1e3 <= limit) for limit, value in checks
        )


def distribution_ms(values: Sequence[float]) -> dict[str, float | None]:
    """mean, median, p90, p99 in milliseconds."""
    ms = [v * 1e3 for v in values]
    return {
        "mean": _mean(ms),
        "median": percentile(ms, 50),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
    }


def error_counts(results: Sequence[RequestResult]) -> dict[str, int]:
    """Failed requests per error, in order of first appearance."""
    return dict(Counter(r.error for r in results if not r.ok))


# --- single requests -----------------------------------------------------------------------------


def summarize(results: Sequence[RequestResult], duration_s: float, slo: SLO | None = None) -> dict:
    """The run's figures, vLLM style."""
    ok = [r for r in results if r.ok]
    output = sum(r.output_tokens for r in ok)
    prompt = sum(r.prompt_tokens for r in ok)
    duration = max(duration_s, 1e-9)
    summary = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": error_counts(results),
        "duration_s": duration_s,
        "request_throughput": len(ok) / duration,
        "output_token_throughput": output / duration,
        "total_token_throughput": (prompt + output) / duration,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "ttft_ms": distribution_ms([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": distribution_ms([r.tpot for r in ok if r.tpot is not None]),
        "itl_ms": distribution_ms([gap for r in ok for gap in r.itls]),
        "e2e_ms": distribution_ms([r.e2e for r in ok]),
    }
    if slo is not None:
        good = sum(slo.met(r) for r in results)
        summary["slo"] = asdict(slo)
        summary["goodput"] = good / duration
        summary["good_requests"] = good
    return summary


def format_summary(s: dict) -> str:
    """A readable table, like vLLM's: counts, throughput, then a row per latency."""
    failed = f" ({_errors(s['errors'])})" if s["errors"] else ""
    lines = [
        f"completed {s['completed']}, failed {s['failed']}{failed}",
        f"{'duration (s)':<16}{s['duration_s']:>9.1f}",
        f"{'requests/s':<16}{s['request_throughput']:>9.2f}",
        f"{'output tok/s':<16}{s['output_token_throughput']:>9.1f}",
        f"{'total tok/s':<16}{s['total_token_throughput']:>9.1f}",
        f"{'prompt tokens':<16}{s['prompt_tokens']:>9}",
        f"{'output tokens':<16}{s['output_tokens']:>9}",
        "",
        f"{'(ms)':<16}" + "".join(f"{k:>9}" for k in ("mean", "median", "p90", "p99")),
    ]
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        d = s[name]
        cells = "".join(f"{_num(d[k]):>9}" for k in ("mean", "median", "p90", "p99"))
        lines.append(f"{name[:-3].upper():<16}{cells}")
    if "goodput" in s:
        slo = s["slo"]
        limits = [
            f"{key[:-3].upper()} <= {value:g} ms" for key, value in slo.items() if value is not None
        ]
        lines += [
            "",
            f"goodput {s['goodput']:.2f} requests/s: {s['good_requests']} of "
            f"{s['completed'] + s['failed']} met {', '.join(limits) or 'no SLO'}",
        ]
    return "\n".join(lines)


def format_origin(figures: dict) -> str:
    """The origin scenario's figures (runs.origin_scenario) as a two-column table."""
    ratio = figures["ttft_ratio"]
    rows = [
        ("the paste", f"{figures['paste_prompt_tokens']} prompt tokens"),
        ("  its TTFT", _ms_text(figures["paste_ttft_ms"])),
        ("streams while it prefilled", ""),
        ("  worst gap", _ms_text(figures["worst_stream_gap_during_paste_ms"])),
        ("  median gap", _ms_text(figures["median_stream_gap_during_paste_ms"])),
        ("the question's TTFT", ""),
        ("  on an idle server", _ms_text(figures["question_ttft_idle_ms"])),
        ("  during the paste", _ms_text(figures["question_ttft_during_paste_ms"])),
        ("  ratio", "–" if ratio is None else f"{ratio:.1f} x"),
        ("every request succeeded", "yes" if figures["all_ok"] else "no"),
    ]
    return "\n".join(f"{label:<28}{value}".rstrip() for label, value in rows)


# --- conversations -------------------------------------------------------------------------------


def summarize_conversations(results: Sequence[ConversationResult], duration_s: float) -> dict:
    """Per-turn figures across conversations, the cold replay's, and the last turn's ratio."""
    n = len(results)
    turns = max((len(c.turns) for c in results), default=0)
    rows = [
        _turn_row(k, [c.turns[k - 1] for c in results if len(c.turns) >= k], n)
        for k in range(1, turns + 1)
    ]
    colds = [c.cold for c in results if c.cold is not None]
    cold = _turn_row("cold", colds, len(colds)) if colds else None
    return {
        "conversations": n,
        "duration_s": duration_s,
        "completed": sum(all(r.ok for r in c.turns) and len(c.turns) == turns for c in results),
        "turns": rows,
        "cold": cold,
        "last_turn": _last_turn(rows[-1], cold) if rows else None,
    }


def _turn_row(label: str | int, results: Sequence[RequestResult], expected: int) -> dict:
    ok = [r for r in results if r.ok]
    errors = error_counts(results)
    if expected > len(results):
        errors["not_reached"] = expected - len(results)
    prompt = [r.prompt_tokens for r in ok]
    cached = [r.cached_tokens for r in ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    return {
        "turn": label,
        "completed": len(ok),
        "failed": expected - len(ok),
        "errors": errors,
        "prompt_tokens": _spread(prompt),
        "cached_tokens": _spread(cached),
        "cached_share": sum(cached) / sum(prompt) if sum(prompt) else None,
        "output_tokens": _mean([r.output_tokens for r in ok]),
        "ttft_ms": distribution_ms(ttfts),
        "ttft_samples": len(ttfts),  # an empty reply has no first token
        "e2e_ms": distribution_ms([r.e2e for r in ok]),
    }


def _last_turn(last: dict, cold: dict | None) -> dict:
    """The last turn's TTFT against the cold replay's."""
    median, cold_median = last["ttft_ms"]["median"], cold and cold["ttft_ms"]["median"]
    return {
        "turn": last["turn"],
        "ttft_median_ms": median,
        "ttft_mean_ms": last["ttft_ms"]["mean"],
        "cold_ttft_median_ms": cold_median,
        "ratio_to_cold": median / cold_median if median and cold_median else None,
    }


def format_conversations(s: dict) -> str:
    """A per-turn table and the last turn's line."""
    lines = [
        f"{s['conversations']} conversations, {s['completed']} complete, {s['duration_s']:.1f} s",
        f"{'turn':>5} {'ok':>5} {'prompt':>7} {'cached':>7} {'TTFT mean':>10} {'median':>8} "
        f"{'p90 (ms)':>9}",
    ]
    for row in [*s["turns"], *([s["cold"]] if s["cold"] else [])]:
        t = row["ttft_ms"]
        lines.append(
            f"{row['turn']:>5} {row['completed']:>2}/{row['completed'] + row['failed']:<2} "
            f"{_num0(row['prompt_tokens']['mean']):>7} {_num0(row['cached_tokens']['mean']):>7} "
            f"{_num0(t['mean']):>10} {_num0(t['median']):>8} {_num0(t['p90']):>9}"
            + (f"  {_errors(row['errors'])}" if row["errors"] else "")
        )
    last = s["last_turn"]
    if last and last["ratio_to_cold"] is not None:
        lines.append(
            f"turn {last['turn']} TTFT median {last['ttft_median_ms']:.0f} ms, cold "
            f"{last['cold_ttft_median_ms']:.0f} ms: {100 * last['ratio_to_cold']:.0f}%"
        )
    return "\n".join(lines)


# --- numbers -------------------------------------------------------------------------------------


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _spread(xs: Sequence[int]) -> dict[str, float | None]:
    return {"mean": _mean(xs), "min": min(xs, default=None), "max": max(xs, default=None)}


def _num(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def _num0(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}"


def _ms_text(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f} ms"


def _errors(counts: dict[str, int]) -> str:
    """Failed requests per error, as words: "busy 2, timeout 1"."""
    return ", ".join(f"{error or 'failed'} {n}" for error, n in counts.items())
