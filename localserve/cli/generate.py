"""`localserve generate`: one prompt through the engine, the text on stdout, its timings after."""

from __future__ import annotations

import argparse
import sys
import time

from localserve.cli.shared import (
    add_model_argument,
    endpoint,
    model_name,
    non_negative_float,
    positive_int,
    say_where,
)
from localserve.config import ConfigError, load_config
from localserve.engine.sampling_params import SamplingParams


def add(sub) -> None:
    g = sub.add_parser(
        "generate",
        help="generate text from one prompt, with timings",
        description="Load the model here, continue one prompt (or answer it, with --chat), and "
        "print the text with its timings: TTFT, tokens per second, prefill speed.",
    )
    g.add_argument("prompt", help="the text to continue (with --chat: to answer)")
    add_model_argument(g)
    g.add_argument(
        "--max-tokens",
        type=positive_int,
        default=128,
        help="tokens to generate at most (default %(default)s)",
    )
    g.add_argument(
        "--temperature",
        type=non_negative_float,
        default=0.0,
        help="0 = greedy (default %(default)s)",
    )
    g.add_argument("--seed", type=int, default=None, help="sampling seed (default: a random one)")
    g.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument(
        "--rpc",
        type=endpoint,
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a `localserve worker` whose devices take layers, besides the model's rpc_workers "
        "(repeatable; n_gpu_layers and tensor_split in models.toml place them). A worker that "
        "dies ends this command",
    )
    g.set_defaults(run=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from localserve.engine.engine import Engine
    from localserve.engine.events import Done, EventRouter, Token
    from localserve.runners.models import open_runner

    config = load_config(args.config)
    name = model_name(config, args.model)
    endpoints = [*config.models[name].rpc_workers, *args.rpc]
    if endpoints:
        from localserve.runners.rpc import add_worker, probe

        for endpoint in endpoints:  # llama.cpp aborts on an unreachable one: ask first
            if why := probe(endpoint):
                raise ConfigError(f"RPC worker {endpoint}: {why}")
        for endpoint in endpoints:  # before the model loads
            add_worker(endpoint)
    runner = open_runner(config, name)
    say_where(runner, file=sys.stderr)  # stdout is the generated text
    router = EventRouter()
    engine = Engine(runner, config.scheduler, on_events=router).start()
    try:
        text = args.prompt
        if args.chat:
            text = runner.apply_chat_template([{"role": "user", "content": text}])
        tokens = runner.tokenize(text)
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            seed=args.seed,
            stop=tuple(args.stop),
        )
        events = router.open("cli")
        started = time.perf_counter()
        engine.add_request("cli", tokens, params, user="cli")
        while True:
            event = events.get()
            if isinstance(event, Token):
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif isinstance(event, Done):
                break
        elapsed = time.perf_counter() - started
        _print_timings(runner.info, event, elapsed)
        return 0 if event.finish_reason != "error" else 1
    finally:
        engine.stop()
        runner.close()


def _print_timings(info, done, elapsed: float) -> None:
    """The timing line under the text; a timing the request never reached shows as –."""
    t = done.timings
    ttft, itl = t.get("ttft_ms"), t.get("itl_ms")
    rate = f"{1e3 / itl:.1f}" if itl else "–"
    print(
        f"\n\n[{info.model} on {info.backend}, {info.n_threads} threads] "
        f"finish={done.finish_reason} prompt={done.prompt_tokens} tokens, "
        f"generated={done.completion_tokens} tokens\n"
        f"TTFT {_ms(ttft, 0)}, ITL {_ms(itl or None, 1)} ({rate} tokens/s), "
        f"total {elapsed:.2f} s",
        file=sys.stderr,
    )


def _ms(value: float | None, digits: int) -> str:
    return "– ms" if value is None else f"{value:.{digits}f} ms"
