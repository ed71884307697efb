"""Running a workload against a `Target`: the load, the conversations, the origin scenario.

The load sends every request once, open-loop at a request rate or closed-loop at a fixed
concurrency; conversations are played turn by turn, a fixed number at a time; the origin
scenario is the situation localserve was built for (streams, a paste, a late question). The run
code only talks to a `Target`, so the same runs measure localserve and an OpenAI peer.

Tested in tests/e2e/test_load_generator.py and tests/unit/bench/test_report.py.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from localserve.bench.scenario import (
    LONG_EXPLANATIONS,
    SHORT_QUESTIONS,
    SUMMARY_REQUESTS,
    TOKENS_PER_WORD,
    pages_slice,
)
from localserve.bench.targets import BenchRequest, RequestResult, Target
from localserve.bench.workloads import (
    REPLY_TOKENS,
    Conversation,
    RequestSpec,
    arrival_times,
    turn_messages,
)
from localserve.engine.stats import percentile

LOAD_TEMPERATURE = 0.7  # single requests sample by default; conversations are greedy

OnDone = Callable[[int, int], None]  # (requests or turns finished, total)


@dataclass
class ConversationResult:
    index: int
    user: str
    turns: list[RequestResult] = field(default_factory=list)  # stops at the first failure
    replies: list[str] = field(default_factory=list)
    cold: RequestResult | None = None  # the last turn again, without reuse (cold replay)


def single(
    spec: RequestSpec, ignore_eos: bool, seed: int, temperature: float = LOAD_TEMPERATURE
) -> BenchRequest:
    """A workload's request as sent: its history and user message, sampled at `temperature`
    (0 = greedy), under its response format."""
    messages = (*spec.history, ("user", spec.prompt))
    return BenchRequest(
        spec.kind,
        messages,
        spec.max_tokens,
        temperature,
        seed,
        ignore_eos,
        response_format=spec.response_format,
    )


class _Progress:
    """Counts finished steps for an `on_done` callback."""

    def __init__(self, total: int, on_done: OnDone | None) -> None:
        self.total, self.on_done, self.finished = total, on_done, 0

    def step(self) -> None:
        self.finished += 1
        if self.on_done:
            self.on_done(self.finished, self.total)


async def _pool(n: int, workers: int, job: Callable[[int], Awaitable[None]]) -> None:
    """job(0), ..., job(n - 1), in order of index, `workers` at a time."""
    queue = iter(range(n))

    async def worker() -> None:
        for i in queue:
            await job(i)

    await asyncio.gather(*(worker() for _ in range(workers)))


# --- the load ------------------------------------------------------------------------------------


async def run_load(
    target: Target,
    specs: Sequence[RequestSpec],
    *,
    rate: float = math.inf,
    burstiness: float = 1.0,
    concurrency: int | None = None,
    ignore_eos: bool = False,
    seed: int = 0,
    temperature: float = LOAD_TEMPERATURE,
    on_done: OnDone | None = None,
) -> tuple[list[RequestResult], float]:
    """Send every request (open loop at `rate`, or closed loop at `concurrency`), each on its
    own connection as user `bench-<i>`, sampled at `temperature`; the results and the run's
    duration."""
    results: list[RequestResult | None] = [None] * len(specs)
    progress = _Progress(len(specs), on_done)
    start = time.perf_counter()

    async def one(i: int) -> None:
        request = single(specs[i], ignore_eos, seed + i, temperature)
        results[i] = await target.send(f"bench-{i}", request)
        progress.step()

    if concurrency:
        await _pool(len(specs), concurrency, one)
    else:
        offsets = arrival_times(len(specs), rate, burstiness, seed)

        async def delayed(i: int) -> None:
            await asyncio.sleep(max(0.0, start + offsets[i] - time.perf_counter()))
            await one(i)

        await asyncio.gather(*(delayed(i) for i in range(len(specs))))
    return [r for r in results if r is not None], time.perf_counter() - start


# --- the conversations ---------------------------------------------------------------------------


async def run_conversations(
    target: Target,
    conversations: Sequence[Conversation],
    *,
    max_tokens: int = REPLY_TOKENS,
    concurrency: int = 1,
    ignore_eos: bool = False,
    seed: int = 0,
    temperature: float = 0.0,
    cold: bool = False,
    warmup: bool = True,
    on_done: OnDone | None = None,
) -> tuple[list[ConversationResult], float]:
    """Play every conversation turn by turn, greedy unless a `temperature` is given;
    `concurrency` conversations at a time.

    Conversation i is a session of user `conv-<i>`. With `cold`, the last turn is sent once
    more without reuse, in a session of another user (`conv-<i>-cold`) — on localserve that
    user's cache is not the conversation's, unless the server shares prefixes across users; an
    OpenAI peer is asked not to reuse (`cache_prompt: false`) — for a with/without comparison
    in one run.
    """
    results = [ConversationResult(i, f"conv-{i}") for i in range(len(conversations))]
    turns = len(conversations[0].user_messages) if conversations else 0
    progress = _Progress(len(conversations) * turns, on_done)
    if warmup:  # first decodes allocate buffers
        await target.send("warmup", single(RequestSpec("short", SHORT_QUESTIONS[0], 8), True, seed))

    async def play(i: int) -> None:
        def request(messages: list[tuple[str, str]], kind: str, reuse: bool = True) -> BenchRequest:
            return BenchRequest(
                kind, tuple(messages), max_tokens, temperature, seed + i, ignore_eos, reuse
            )

        await _play(target, conversations[i], results[i], request, cold, progress)

    start = time.perf_counter()
    await _pool(len(conversations), max(1, concurrency), play)
    return results, time.perf_counter() - start


async def _play(
    target: Target,
    conv: Conversation,
    out: ConversationResult,
    request: Callable[..., BenchRequest],
    cold: bool,
    progress: _Progress,
) -> None:
    """One conversation to its end or its first failure, then its cold replay if asked."""
    played = 0
    try:
        async with target.session(out.user) as session:
            for turn in range(1, len(conv.user_messages) + 1):
                messages = turn_messages(conv, out.replies, turn)
                result, reply = await session.ask(request(messages, f"turn-{turn}"))
                out.turns.append(result)
                out.replies.append(reply)
                played += 1
                progress.step()
                if not result.ok:
                    return
            if cold:
                last = turn_messages(conv, out.replies[:-1], len(conv.user_messages))
                async with target.session(f"{out.user}-cold") as other:
                    out.cold, _ = await other.ask(request(last, "cold", reuse=False))
    finally:
        for _ in range(len(conv.user_messages) - played):
            progress.step()  # turns never played still move the progress to its end


# --- the origin scenario -------------------------------------------------------------------------


async def origin_scenario(target: Target, seed: int = 0) -> dict:
    """Three users stream; a ~3,000-token paste arrives; a short question arrives meanwhile.

    Measures the worst gap between tokens of the users already streaming while the paste is
    prefilled, and the short question's TTFT, against the same question on an idle server.
    """
    rng = random.Random(seed)
    question = RequestSpec("short", SHORT_QUESTIONS[0], 16)

    def send(user: str, spec: RequestSpec, seed: int) -> Awaitable[RequestResult]:
        return target.send(user, single(spec, True, seed))

    await send("warmup", question, seed)  # first decodes allocate buffers
    idle = await send("idle", question, seed)
    streams = [RequestSpec("long", LONG_EXPLANATIONS[i], 400) for i in range(3)]
    text = pages_slice(rng, round(3000 / TOKENS_PER_WORD))
    paste = RequestSpec("paste", f"{text}\n\n{SUMMARY_REQUESTS[0]}", 32)
    tasks = [asyncio.create_task(send(f"s{i}", s, seed + i)) for i, s in enumerate(streams)]
    await asyncio.sleep(4.0)  # everyone is streaming
    paste_task = asyncio.create_task(send("paster", paste, seed))
    await asyncio.sleep(1.0)  # the paste is being prefilled
    asked = await send("asker", question, seed)
    pasted = await paste_task
    streamed = await asyncio.gather(*tasks)
    return _origin_figures(idle, asked, pasted, streamed)


def _origin_figures(
    idle: RequestResult,
    asked: RequestResult,
    pasted: RequestResult,
    streamed: Sequence[RequestResult],
) -> dict:
    """The streams' token gaps while the paste was prefilled, and the question's TTFTs."""
    start, end = pasted.sent, pasted.token_times[0] if pasted.token_times else pasted.done
    gaps = [b - a for r in streamed for a, b in pairwise(r.token_times) if start <= b <= end]
    return {
        "paste_prompt_tokens": pasted.prompt_tokens,
        "paste_ttft_ms": _ms(pasted.ttft),
        "worst_stream_gap_during_paste_ms": _ms(max(gaps, default=None)),
        "median_stream_gap_during_paste_ms": _ms(percentile(gaps, 50)),
        "question_ttft_idle_ms": _ms(idle.ttft),
        "question_ttft_during_paste_ms": _ms(asked.ttft),
        "ttft_ratio": (asked.ttft / idle.ttft) if asked.ttft and idle.ttft else None,
        "all_ok": all(r.ok for r in [idle, asked, pasted, *streamed]),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3
