"""`localserve bench`: a load generator against a running server, localserve's or an
OpenAI-compatible peer's: one workload of single requests, multi-turn conversations, or the
origin scenario.

Tested in tests/unit/cli/test_cli.py (its options) and tests/e2e/test_load_generator.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from localserve.cli.shared import (
    http_address,
    positive_float,
    positive_int,
    server_address,
)


def add(sub) -> None:
    lb = sub.add_parser(
        "bench",
        help="load generator against a running server (client-side)",
        description="Send a workload to a running server, localserve's or an OpenAI-compatible "
        "peer's, and report what its users felt: TTFT, inter-token latency, end-to-end time and "
        "throughput, measured on the client.",
    )
    _add_target_options(lb)
    _add_load_options(lb)
    _add_conversation_options(lb.add_argument_group("--workload conversation"))
    lb.add_argument(
        "--origin",
        action="store_true",
        help="instead: the origin scenario (streams + a 3,000-token paste + a question)",
    )
    lb.set_defaults(run=cmd_bench)


def _add_target_options(lb) -> None:
    lb.add_argument(
        "--url",
        type=server_address,
        default="ws://127.0.0.1:8765",
        help="localserve's address (default %(default)s)",
    )
    lb.add_argument(
        "--peer",
        metavar="URL",
        type=http_address,
        help="bench an OpenAI-compatible server instead (e.g. http://127.0.0.1:8080)",
    )
    lb.add_argument(
        "--endpoint",
        choices=["completions", "chat"],
        default="completions",
        help="with --peer: /v1/completions (transcript text, any server) or "
        "/v1/chat/completions (messages; localserve renders them as for a websocket chat); "
        "default %(default)s",
    )


def _add_load_options(lb) -> None:
    lb.add_argument(
        "--workload",
        default="mixed",
        help="short | long | paste | chat | mixed | edit (paste and repeat it with corrections) | "
        "quote (summarise a paste, quoting it) | conversation (multi-turn, per-turn report); "
        "default %(default)s",
    )
    lb.add_argument(
        "--num-requests",
        type=positive_int,
        default=50,
        help="requests to send (default %(default)s)",
    )
    lb.add_argument(
        "--request-rate",
        type=positive_float,
        default=float("inf"),
        help="requests/s, open loop (default inf: all at once)",
    )
    lb.add_argument(
        "--burstiness",
        type=positive_float,
        default=1.0,
        help="gamma shape; 1 = Poisson (default %(default)s)",
    )
    lb.add_argument(
        "--concurrency",
        type=positive_int,
        help="closed loop: this many in flight instead (conversation: conversations at a time)",
    )
    lb.add_argument("--ignore-eos", action="store_true", help="fixed output lengths")
    lb.add_argument(
        "--max-tokens",
        type=positive_int,
        help="output tokens of every request (default: per kind, short 48, long 320, paste 96; "
        "conversation: 64 per turn)",
    )
    lb.add_argument(
        "--temperature",
        type=float,
        help="sampling temperature of every request, 0 = greedy (default: 0.7 for single "
        "requests, 0 for conversations; the origin scenario keeps its own)",
    )
    lb.add_argument("--slo", default="", help="goodput SLOs, e.g. ttft=1000,tpot=150 (ms)")
    lb.add_argument("--seed", type=int, default=0, help="workload seed (default %(default)s)")
    lb.add_argument("--out", help="write the summary and per-request timings as JSON here")


def _add_conversation_options(cv) -> None:
    cv.add_argument(
        "--conversations",
        type=positive_int,
        default=4,
        help="conversations to play (default %(default)s)",
    )
    cv.add_argument(
        "--turns",
        type=positive_int,
        default=5,
        help="user turns per conversation (default %(default)s)",
    )
    cv.add_argument(
        "--turn-tokens",
        type=positive_int,
        default=350,
        help="document tokens per user turn (350: turn 5 has ~2,000) (default %(default)s)",
    )
    cv.add_argument(
        "--cold",
        action="store_true",
        help="then replay each last turn without reuse (another user; peer: "
        "cache_prompt false) for a with/without ratio in one run",
    )


def cmd_bench(args: argparse.Namespace) -> int:
    import asyncio

    from localserve import bench
    from localserve.bench import runs
    from localserve.runners.models import terminal_progress

    if args.temperature is not None and not args.temperature >= 0:
        raise ValueError("--temperature must be at least 0 (0 = greedy)")
    target = bench.target(args.peer or args.url, bool(args.peer), args.endpoint)
    if args.origin:
        figures = asyncio.run(runs.origin_scenario(target, args.seed))
        print(bench.format_origin(figures))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(figures, f, indent=1)
        return 0 if figures["all_ok"] else 1
    if args.workload == "conversation":
        return _bench_conversations(args)
    slo = bench.SLO.parse(args.slo) if args.slo else None
    specs = bench.build_requests(args.workload, args.num_requests, args.seed, args.max_tokens)
    progress = terminal_progress(f"{args.workload} x{args.num_requests}")
    load = runs.run_load(
        target,
        specs,
        rate=args.request_rate,
        burstiness=args.burstiness,
        concurrency=args.concurrency,
        ignore_eos=args.ignore_eos,
        seed=args.seed,
        temperature=runs.LOAD_TEMPERATURE if args.temperature is None else args.temperature,
        on_done=progress,
    )
    results, duration = asyncio.run(load)
    summary = bench.summarize(results, duration, slo)
    print(bench.format_summary(summary))
    if args.out:
        record = {
            "args": vars(args) | {"run": None},
            "summary": summary,
            "requests": [dataclasses.asdict(r) for r in results],
        }
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1, default=str)
    return 0 if summary["completed"] else 1


def _bench_conversations(args: argparse.Namespace) -> int:
    import asyncio

    from localserve import bench
    from localserve.bench import runs
    from localserve.bench.workloads import REPLY_TOKENS
    from localserve.runners.models import terminal_progress

    conversations = bench.build_conversations(
        args.conversations, args.turns, args.turn_tokens, args.seed
    )
    label = f"{args.conversations} conversations x{args.turns}"
    talks = runs.run_conversations(
        bench.target(args.peer or args.url, bool(args.peer)),
        conversations,
        max_tokens=REPLY_TOKENS if args.max_tokens is None else args.max_tokens,
        concurrency=args.concurrency or 1,
        ignore_eos=args.ignore_eos,
        seed=args.seed,
        temperature=0.0 if args.temperature is None else args.temperature,
        cold=args.cold,
        on_done=terminal_progress(label, unit=" turns"),
    )
    results, duration = asyncio.run(talks)
    summary = bench.summarize_conversations(results, duration)
    print(bench.format_conversations(summary))
    if args.out:
        record = {
            "args": vars(args) | {"run": None},
            "server": "peer" if args.peer else "localserve",
            "url": args.peer or args.url,
            "summary": summary,
            "conversations": [
                {
                    "index": c.index,
                    "user": c.user,
                    "user_messages": list(conv.user_messages),
                    "replies": c.replies,
                    "turns": [dataclasses.asdict(r) for r in c.turns],
                    "cold": dataclasses.asdict(c.cold) if c.cold else None,
                }
                for c, conv in zip(results, conversations, strict=True)
            ],
        }
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1, default=str)
    return 0 if summary["completed"] == len(results) else 1
