"""`localserve bench`: a load generator, measured on the client, against localserve or a peer.

- `workloads`: what is sent and when (request mixes, multi-turn conversations, arrival times);
- `targets`: where it is sent (localserve's websocket protocol, or an OpenAI-compatible
  streaming endpoint such as llama.cpp's `llama-server`, so the two compare side by side) and
  what is measured of each request;
- `runs`: the load, the conversations and the origin scenario, run against a target;
- `report`: the figures (vLLM's `bench serve` definitions) and their readable form.

The names below are the package's public ones. `run_load`, `run_conversations` and
`origin_scenario` here take a URL and an `openai` flag, as the command line gives them, and run
the functions of `runs` on the target those name.
"""

from __future__ import annotations

from collections.abc import Sequence

from localserve.bench import runs
from localserve.bench.report import (
    SLO,
    distribution_ms,
    format_conversations,
    format_summary,
    summarize,
    summarize_conversations,
)
from localserve.bench.runs import ConversationResult
from localserve.bench.targets import (
    OpenAITarget,
    Request,
    RequestResult,
    Target,
    WebSocketTarget,
    target,
)
from localserve.bench.workloads import (
    KINDS,
    WORKLOADS,
    Conversation,
    RequestSpec,
    arrival_times,
    build_conversations,
    build_requests,
    estimate_prompt_tokens,
    turn_messages,
)
from localserve.stats import percentile

__all__ = [
    "KINDS",
    "SLO",
    "WORKLOADS",
    "Conversation",
    "ConversationResult",
    "OpenAITarget",
    "Request",
    "RequestResult",
    "RequestSpec",
    "Target",
    "WebSocketTarget",
    "arrival_times",
    "build_conversations",
    "build_requests",
    "distribution_ms",
    "estimate_prompt_tokens",
    "format_conversations",
    "format_summary",
    "origin_scenario",
    "percentile",
    "run_conversations",
    "run_load",
    "summarize",
    "summarize_conversations",
    "target",
    "turn_messages",
]


async def run_load(
    url: str,
    specs: Sequence[RequestSpec],
    *,
    openai: bool = False,
    endpoint: str = "completions",
    **options,
) -> tuple[list[RequestResult], float]:
    """`runs.run_load` against the server at `url` (an OpenAI endpoint with `openai`)."""
    return await runs.run_load(target(url, openai, endpoint), specs, **options)


async def run_conversations(
    url: str, conversations: Sequence[Conversation], *, openai: bool = False, **options
) -> tuple[list[ConversationResult], float]:
    """`runs.run_conversations` against the server at `url` (/v1/completions with `openai`)."""
    return await runs.run_conversations(target(url, openai), conversations, **options)


async def origin_scenario(url: str, openai: bool = False, seed: int = 0) -> dict:
    """`runs.origin_scenario` against the server at `url` (/v1/completions with `openai`)."""
    return await runs.origin_scenario(target(url, openai), seed)
