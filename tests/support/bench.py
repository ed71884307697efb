"""Synthetic results of the load generator's requests (localserve/bench/targets.py), for the
figures made of them."""

from __future__ import annotations

from localserve.bench.targets import RequestResult


def result(sent: float, gaps: list[float], ttft: float, ok: bool = True, tokens=None):
    """A request sent at `sent`, first token after `ttft`, then token frames `gaps` apart."""
    times = [sent + ttft]
    for gap in gaps:
        times.append(times[-1] + gap)
    n = tokens if tokens is not None else len(times)
    return RequestResult(
        "short",
        ok=ok,
        error="" if ok else "busy",
        prompt_tokens=10,
        output_tokens=n if ok else 0,
        sent=sent,
        token_times=times if ok else [],
        done=times[-1],
    )
