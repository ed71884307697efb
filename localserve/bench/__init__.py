"""`localserve bench`: a load generator, measured on the client, against localserve or a peer.

- `workloads.py`: what is sent and when (request mixes, multi-turn conversations, arrival
  times).
- `targets.py`: where it is sent (localserve's websocket protocol, or an OpenAI-compatible
  streaming endpoint such as llama.cpp's `llama-server`, so the two compare side by side) and
  what is measured of each request.
- `runs.py`: the load, the conversations and the origin scenario, run against a target.
- `scenario.py`: the origin scenario: four people sharing one server, over websockets.
- `report.py`: the figures (vLLM's `bench serve` definitions) and their readable form.
- `sweep.py`: `localserve sweep`: concurrency x workload x policy, with a table and a chart.
- `engine.py`: the engine's decode throughput against a bare `llama_decode` loop.
- `fake_server.py`: the server on the paced fake runner, for benchmarks and tests without a
  model.
- `blocking_ws.py`: a blocking websocket client speaking JSON dicts (`WS`).
- `hostile.py`: hostile clients: a bare-socket websocket client, a socket squatter.

The names below are the package's public ones; `target(url, openai, endpoint)` names the target
a command line's URL and flags mean, and `runs` runs against it. The benchmarks in benchmarks/
use this package and never the tests' code; the tests import what they share with them from
here.
"""

from __future__ import annotations

from localserve.bench import runs
from localserve.bench.report import (
    SLO,
    distribution_ms,
    format_conversations,
    format_origin,
    format_summary,
    summarize,
    summarize_conversations,
)
from localserve.bench.runs import ConversationResult
from localserve.bench.targets import (
    BenchRequest,
    OpenAITarget,
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
from localserve.engine.stats import percentile

__all__ = [
    "KINDS",
    "SLO",
    "WORKLOADS",
    "Conversation",
    "ConversationResult",
    "OpenAITarget",
    "BenchRequest",
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
    "format_origin",
    "format_summary",
    "percentile",
    "runs",
    "summarize",
    "summarize_conversations",
    "target",
    "turn_messages",
]
