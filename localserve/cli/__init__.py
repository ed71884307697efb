"""`localserve` command line: serve, generate, models, bench, sweep and bench-engine here; other
packages add theirs (the `tui` package: demo, monitor and chat) through the entry-point group
`localserve.commands`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable

import msgspec

from localserve.config import ConfigError, load_config
from localserve.engine.sampling_params import SamplingParams

log = logging.getLogger("localserve")

COMMANDS_GROUP = "localserve.commands"  # name = "module:add", add(subparsers) adds `name`
NO_PREFIX_CACHE_HELP = "keep no finished conversations' KV: every turn prefills its whole prompt"

AddCommand = Callable[[argparse._SubParsersAction], None]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # llama.cpp warns about harmless model quirks at every load; -v shows them
    logging.getLogger("llama_cpp").setLevel(logging.DEBUG if args.verbose else logging.ERROR)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except (ConfigError, ValueError) as e:
        print(f"localserve: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _parser(commands: Iterable[AddCommand] | None = None) -> argparse.ArgumentParser:
    """The whole command line: the commands installed packages add (or `commands`), then ours."""
    p = argparse.ArgumentParser(prog="localserve", description=__doc__)
    p.add_argument("--config", help="models.toml (default: $LOCALSERVE_MODELS or ./models.toml)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging, llama.cpp's too")
    sub = p.add_subparsers(title="commands")
    added = installed_commands() if commands is None else list(commands)
    if not added:
        p.epilog = "demo, monitor and chat are missing: reinstall (`make setup`) to add them"
    for add in (*added, *BUILTIN_COMMANDS):
        add(sub)
    return p


def installed_commands() -> list[AddCommand]:
    """The commands other installed packages register under the entry-point group."""
    found = []
    for entry in importlib.metadata.entry_points(group=COMMANDS_GROUP):
        try:
            found.append(entry.load())
        except Exception as e:  # a broken add-on must not take `serve` down with it
            print(f"localserve: command {entry.name!r} unavailable: {e}", file=sys.stderr)
    return found


# --- helpers for the commands, ours and the add-ons' -------------------------------------------


def add_model_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="a name from models.toml (default: its `default`)")


def prefix_cache_option(config, no_prefix_cache: bool):
    """The config, with prefix caching turned off if asked."""
    if not no_prefix_cache:
        return config
    scheduler = msgspec.structs.replace(config.scheduler, prefix_caching=False)
    return msgspec.structs.replace(config, scheduler=scheduler)


def log_to_file(name: str) -> str:
    """A full-screen app owns the terminal: logs go to a file instead."""
    from localserve.runners.models import cache_dir

    path = cache_dir() / f"{name}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    return str(path)


def say_where(runner, file=None) -> None:
    """Print and log what runs where, and warn when a GPU is idle for want of a CUDA build."""
    block = f"localserve: {runner.info.model}\n{runner.where()}"
    print(block, file=file or sys.stdout, flush=True)
    log.info("%s", block)
    warning = _gpu_warning()
    if warning:
        print(warning, file=sys.stderr, flush=True)
        log.warning("%s", warning)


def _gpu_warning() -> str | None:
    from localserve.runners.placement import gpu_without_offload
    from localserve.runners.rpc import has_local_gpu

    return gpu_without_offload(has_local_gpu())


# --- serve ---------------------------------------------------------------------------------------


def _add_serve(sub) -> None:
    s = sub.add_parser("serve", help="the websocket chat server (and /healthz, /metrics)")
    add_model_argument(s)
    s.add_argument("--host", help="address to bind (default 127.0.0.1, from models.toml)")
    s.add_argument("--port", type=int, help="port (default 8765, from models.toml; 0 = any)")
    s.add_argument("--users", help='users file: a TOML [users] table of name = "token"')
    s.add_argument("--open", action="store_true", help="allow a network bind without tokens")
    s.add_argument("--monitor-token", help="require this token for stats subscriptions")
    s.add_argument("--no-prefix-cache", action="store_true", help=NO_PREFIX_CACHE_HELP)
    s.add_argument("--state-dir", help="usage database and access log (default [server] state_dir)")
    s.add_argument(
        "--access-log", help='"off", or a file (default: off on loopback, else in the state dir)'
    )
    s.set_defaults(run=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio

    from localserve.ops.auth import Access, load_daily_tokens, load_users
    from localserve.serve.server import run
    from localserve.serve.serving import serving

    config = prefix_cache_option(load_config(args.config), args.no_prefix_cache)
    host = args.host or config.server.host
    port = config.server.port if args.port is None else args.port
    access = Access(load_users(args.users), args.monitor_token)
    daily_tokens = load_daily_tokens(args.users)
    if unknown := sorted(set(daily_tokens) - set(access.users)):
        raise ConfigError(f"{args.users}: daily_tokens for users it does not have: {unknown}")
    config.server = team_options(config.server, args, daily_tokens)
    access.check_bind(host, args.open)  # before the model loads: fail fast
    with serving(config, args.model, access=access) as served:
        say_where(served.runner)
        asyncio.run(run(served.server, host, port))
    return 0


# --- generate ------------------------------------------------------------------------------------


def _add_generate(sub) -> None:
    g = sub.add_parser("generate", help="generate text from one prompt, with timings")
    g.add_argument("prompt")
    add_model_argument(g)
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument(
        "--rpc",
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
    name = args.model or config.default
    model = config.models.get(name)
    endpoints = [*(model.rpc_workers if model else []), *args.rpc]
    if endpoints:
        from localserve.runners.rpc import add_worker, probe

        for endpoint in endpoints:  # llama.cpp aborts on an unreachable one: ask first
            if why := probe(endpoint):
                raise ConfigError(f"RPC worker {endpoint}: {why}")
        for endpoint in endpoints:  # before the model loads
            add_worker(endpoint)
    runner = open_runner(config, args.model)
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


# --- models --------------------------------------------------------------------------------------


def _add_models(sub) -> None:
    m = sub.add_parser("models", help="list configured models; assemble the embedded one")
    m.set_defaults(run=cmd_models)


def cmd_models(args: argparse.Namespace) -> int:
    from localserve.runners.models import resolve_model

    config = load_config(args.config)
    for name, model in config.models.items():
        mark = "*" if name == config.default else " "
        path = resolve_model(name, model)
        print(f"{mark} {name:20} {path}  n_ctx={model.n_ctx} max_num_seqs={model.max_num_seqs}")
    print(_build_line())
    warning = _gpu_warning()
    if warning:
        print(warning, file=sys.stderr)
    return 0


def _build_line() -> str:
    """Which llama.cpp is installed: what it can offload to (without loading a model)."""
    import llama_cpp

    from localserve.runners.rpc import has_local_gpu, supports_rpc

    system = llama_cpp.llama_print_system_info().decode(errors="replace")
    rpc = ", RPC backend" if supports_rpc() else ""
    if not has_local_gpu():
        return f"llama.cpp: CPU build (no GPU offload{rpc})"
    kind = "CUDA" if "CUDA" in system else "GPU"
    return f"llama.cpp: {kind} build (layers can be offloaded{rpc})"


# --- bench ---------------------------------------------------------------------------------------


def _add_bench(sub) -> None:
    lb = sub.add_parser("bench", help="load generator against a running server (client-side)")
    lb.add_argument("--url", default="ws://127.0.0.1:8765")
    lb.add_argument(
        "--peer",
        metavar="URL",
        help="bench an OpenAI-compatible server instead (e.g. http://127.0.0.1:8080)",
    )
    lb.add_argument(
        "--endpoint",
        choices=["completions", "chat"],
        default="completions",
        help="with --peer: /v1/completions (transcript text, any server) or "
        "/v1/chat/completions (messages; localserve renders them as for a websocket chat)",
    )
    lb.add_argument(
        "--workload",
        default="mixed",
        help="short | long | paste | chat | mixed | conversation (multi-turn, per-turn report)",
    )
    lb.add_argument("--num-requests", type=int, default=50)
    lb.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="requests/s, open loop (default inf: all at once)",
    )
    lb.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; 1 = Poisson")
    lb.add_argument(
        "--concurrency",
        type=int,
        help="closed loop: this many in flight instead (conversation: conversations at a time)",
    )
    lb.add_argument("--ignore-eos", action="store_true", help="fixed output lengths")
    lb.add_argument(
        "--max-tokens",
        type=int,
        help="output tokens of every request (default: per kind, short 48, long 320, paste 96; "
        "conversation: 64 per turn)",
    )
    lb.add_argument("--slo", default="", help="goodput SLOs, e.g. ttft=1000,tpot=150 (ms)")
    lb.add_argument("--seed", type=int, default=0)
    lb.add_argument("--out", help="write the summary and per-request timings as JSON here")
    _add_conversation_options(lb.add_argument_group("--workload conversation"))
    lb.add_argument(
        "--origin",
        action="store_true",
        help="instead: the origin scenario (streams + a 3,000-token paste + a question)",
    )
    lb.set_defaults(run=cmd_bench)


def _add_conversation_options(cv) -> None:
    cv.add_argument("--conversations", type=int, default=4, help="conversations to play")
    cv.add_argument("--turns", type=int, default=5, help="user turns per conversation")
    cv.add_argument(
        "--turn-tokens",
        type=int,
        default=350,
        help="document tokens per user turn (350: turn 5 has ~2,000)",
    )
    cv.add_argument(
        "--cold",
        action="store_true",
        help="then replay each last turn without reuse (another user; peer: "
        "cache_prompt false) for a with/without ratio in one run",
    )


def cmd_bench(args: argparse.Namespace) -> int:
    import asyncio
    import dataclasses
    import json

    from localserve import bench
    from localserve.bench import runs
    from localserve.runners.models import terminal_progress

    target = bench.target(args.peer or args.url, bool(args.peer), args.endpoint)
    if args.origin:
        figures = asyncio.run(runs.origin_scenario(target, args.seed))
        print(json.dumps(figures, indent=1))
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
    import dataclasses
    import json

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


# --- sweep ---------------------------------------------------------------------------------------


def _add_sweep(sub) -> None:
    sw = sub.add_parser("sweep", help="concurrency x workload x policy sweep, table and chart")
    add_model_argument(sw)
    sw.add_argument("--policies", default="continuous,static")
    sw.add_argument("--workloads", default="chat,mixed")
    sw.add_argument("--concurrency", default="1,2,4,8,16")
    sw.add_argument("--num-requests", type=int, default=16, help="per point (at least 2x c)")
    sw.add_argument("--seed", type=int, default=0)
    sw.add_argument("--out-dir", default="bench-results")
    sw.set_defaults(run=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from localserve.bench.sweep import run_sweep, write_results
    from localserve.runners.models import open_runner

    config = load_config(args.config)
    name = args.model or config.default
    runner = open_runner(config, name)
    try:
        points = run_sweep(
            config,
            runner,
            name,
            args.policies.split(","),
            args.workloads.split(","),
            [int(c) for c in args.concurrency.split(",")],
            args.num_requests,
            args.seed,
        )
    finally:
        runner.close()
    out = write_results(points, args.out_dir)
    print((out / "sweep.md").read_text())
    print(f"written: {out}/sweep.json, sweep.md, sweep.svg")
    return 0


# --- bench-engine --------------------------------------------------------------------------------


def _add_bench_engine(sub) -> None:
    b = sub.add_parser("bench-engine", help="engine vs bare llama_decode throughput benchmark")
    add_model_argument(b)
    b.add_argument("--concurrency", default="1,4,8,16", help="comma-separated sequence counts")
    b.add_argument("--tokens", type=int, default=64, help="decode steps per measurement")
    b.add_argument("--out", help="write the results as JSON here")
    b.set_defaults(run=cmd_bench_engine)


def cmd_bench_engine(args: argparse.Namespace) -> int:
    from localserve.bench.engine import run_benchmark

    concurrency = [int(c) for c in args.concurrency.split(",")]
    return run_benchmark(load_config(args.config), args.model, concurrency, args.tokens, args.out)


def team_options(server, args: argparse.Namespace, daily_tokens: dict[str, int]):
    """[server] with the command line's state directory and access log, and the users file's
    quotas over models.toml's."""
    changes: dict = {"daily_tokens_per_user": server.daily_tokens_per_user | daily_tokens}
    if getattr(args, "state_dir", None):
        changes["state_dir"] = args.state_dir
    if getattr(args, "access_log", None):
        changes["access_log"] = args.access_log
    return msgspec.structs.replace(server, **changes)


# --- usage ---------------------------------------------------------------------------------------


def _add_usage(sub) -> None:
    u = sub.add_parser("usage", help="who used how much: per user and day, from the usage record")
    u.add_argument("--since", default="today", help="today (default), 7d, 24h or 2026-11-01")
    u.add_argument("--user", help="only this user")
    u.add_argument("--json", action="store_true", help="JSON lines, one per day and user")
    u.add_argument("--state-dir", help="where the database is (default [server] state_dir)")
    u.add_argument("--users", help="the server's users file (for its [daily_tokens] quotas)")
    u.set_defaults(run=cmd_usage)


def cmd_usage(args: argparse.Namespace) -> int:
    from localserve.ops import usage
    from localserve.ops.auth import load_daily_tokens

    config = load_config(args.config)
    server = team_options(config.server, args, load_daily_tokens(args.users))
    since = usage.parse_since(args.since, time.time())
    db = usage.connect(usage.state_dir(server) / usage.DATABASE, readonly=True)
    try:
        days = usage.by_day(db, since, args.user)
    finally:
        db.close()
    if args.json:
        for day in days:
            print(json.dumps(usage.day_dict(day), ensure_ascii=False))
    else:
        print(usage.table(days, server))
    return 0


# --- worker --------------------------------------------------------------------------------------

RPC_WARNING = (
    "WARNING: llama.cpp's RPC protocol has no authentication and no encryption: anyone who can "
    "reach {endpoint} can run computations on this machine's devices, fill its memory and see "
    "every tensor that passes. Lend a machine this way only on a network you trust (a home LAN "
    "behind its router), never on the internet."
)


def _add_worker(sub) -> None:
    w = sub.add_parser(
        "worker", help="lend this machine's CPU or GPUs to a server elsewhere (llama.cpp RPC)"
    )
    w.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    w.add_argument("--port", type=int, default=50052, help="port (50052)")
    w.add_argument(
        "--allow-network", action="store_true", help="listen on an address other than loopback"
    )
    w.add_argument(
        "--device",
        action="append",
        default=[],
        help="a device to lend (repeatable; default: every GPU, else the CPU); see --list",
    )
    w.add_argument("--list", action="store_true", help="list this machine's devices and stop")
    w.add_argument(
        "--cache-dir",
        help="where received tensors are kept, so a restart does not resend the weights "
        "(default ~/.cache/localserve/rpc; 'off' keeps none)",
    )
    w.add_argument("--threads", type=int, help="CPU threads (default: every core)")
    w.set_defaults(run=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    import os
    import signal
    import threading

    from localserve.ops.auth import is_loopback
    from localserve.runners import rpc
    from localserve.runners.models import cache_dir

    local = [d for d in rpc.devices() if not d.is_remote]
    if args.list:
        for d in local:
            print(f"{d.name:8s} {d.kind:4s} {d.total_bytes / 2**30:6.1f} GiB  {d.description}")
        return 0
    if not rpc.supports_rpc():
        raise ConfigError("this llama.cpp build has no RPC backend: run `make setup` again")
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port}: 1-65535")
    endpoint = f"{args.host}:{args.port}"
    if not is_loopback(args.host):
        if not args.allow_network:
            raise ConfigError(
                f"refusing to listen on {args.host} without --allow-network: "
                + RPC_WARNING.format(endpoint=endpoint)
            )
        print(RPC_WARNING.format(endpoint=endpoint), file=sys.stderr, flush=True)
    names = args.device or [d.name for d in local if d.kind in ("GPU", "iGPU")] or ["CPU"]
    if unknown := [n for n in names if n not in {d.name for d in local}]:
        known = ", ".join(d.name for d in local)
        raise ConfigError(f"--device {', '.join(unknown)}: not on this machine ({known})")
    cache = None if args.cache_dir == "off" else args.cache_dir or str(cache_dir() / "rpc")
    if cache:
        os.makedirs(cache, exist_ok=True)
    threads = args.threads or os.cpu_count() or 1
    server = threading.Thread(
        target=rpc.start_server, args=(endpoint, cache, threads, names), daemon=True
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    deadline = time.monotonic() + 10
    while rpc.listening(args.port) is False and server.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)  # said only once it listens: a server may connect at once
    lent = ", ".join(f"{d.name} ({d.description})" for d in local if d.name in names)
    print(
        f"localserve worker: lending {lent} at {endpoint}"
        f"{f'; tensors cached in {cache}' if cache else ''} (Ctrl-C stops)",
        flush=True,
    )
    while not stop.wait(0.2):
        if not server.is_alive():
            print(f"localserve worker: the RPC server at {endpoint} stopped", file=sys.stderr)
            return 1
    # llama.cpp's RPC server has no stop: the process ends (its client sees the connection go)
    print("localserve worker: stopping", flush=True)
    sys.stdout.flush()
    os._exit(0)


BUILTIN_COMMANDS: tuple[AddCommand, ...] = (
    _add_serve,
    _add_worker,
    _add_usage,
    _add_generate,
    _add_models,
    _add_bench,
    _add_sweep,
    _add_bench_engine,
)


if __name__ == "__main__":
    sys.exit(main())
