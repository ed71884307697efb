"""`localserve serve`: the chat server on one port: the page, websocket chat, the OpenAI, Ollama and
Anthropic APIs, /healthz and /metrics.

Tested in tests/unit/cli/test_cli.py and tests/e2e/test_serving.py.
"""

from __future__ import annotations

import argparse

from localserve.cli.shared import (
    NO_PREFIX_CACHE_HELP,
    add_model_argument,
    check_port,
    model_name,
    port_number,
    prefix_cache_option,
    say_where,
    team_options,
)
from localserve.config import ConfigError, config_path, load_config


def add(sub) -> None:
    s = sub.add_parser(
        "serve",
        help="serve a model on one port: the chat page, websocket chat, the OpenAI, Ollama "
        "and Anthropic APIs",
        description="Serve a model to several people on one port: the chat page at /, websocket "
        "chat and stats (ws://HOST:PORT), the OpenAI API under /v1 (chat/completions, "
        "completions, responses, embeddings, models), the Ollama API under /api (chat, "
        "generate, embed, embeddings, tags, show, ps, version, pull), the Anthropic API at "
        "/v1/messages (and /v1/messages/count_tokens), /healthz and /metrics (Prometheus). The "
        "engine runs in a supervised process of its own; the usage record and quotas are kept "
        "in the state directory.",
    )
    add_model_argument(s)
    s.add_argument("--host", help="address to bind (default 127.0.0.1, from models.toml)")
    s.add_argument(
        "--port", type=port_number, help="port (default 8765, from models.toml; 0 = any)"
    )
    s.add_argument("--users", help='users file: a TOML [users] table of name = "token"')
    s.add_argument("--open", action="store_true", help="allow a network bind without tokens")
    s.add_argument(
        "--monitor-token",
        help="the token stats and /metrics need (default: the users file's [monitor] token, "
        "else, with users, one kept in the state dir's monitor_token)",
    )
    s.add_argument("--no-prefix-cache", action="store_true", help=NO_PREFIX_CACHE_HELP)
    s.add_argument("--state-dir", help="usage database and access log (default [server] state_dir)")
    s.add_argument(
        "--access-log", help='"off", or a file (default: off on loopback, else in the state dir)'
    )
    s.set_defaults(run=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio

    from localserve.ops.auth import (
        Access,
        check_frontends,
        check_users_file_private,
        is_known_user,
        load_daily_tokens,
        load_monitor_token,
        load_users,
    )
    from localserve.ops.monitor_token import server_monitor_token, token_file
    from localserve.serve.server import run
    from localserve.serve.serving import serving

    config = prefix_cache_option(load_config(args.config), args.no_prefix_cache)
    name = model_name(config, args.model)
    host = args.host or config.server.host
    port = config.server.port if args.port is None else args.port
    users = load_users(args.users)
    daily_tokens = load_daily_tokens(args.users)
    trusted = config.server.trusted_frontends
    check_frontends(trusted, users)
    if unknown := sorted(u for u in daily_tokens if not is_known_user(u, users, trusted)):
        raise ConfigError(f"{args.users}: daily_tokens for users it does not have: {unknown}")
    config.server = team_options(config.server, args, daily_tokens)
    configured = args.monitor_token or load_monitor_token(args.users)
    access = Access(users, server_monitor_token(configured, users, config.server))
    access.check_bind(host, args.open)  # before the model loads: fail fast
    check_users_file_private(args.users)  # as the monitor token is
    check_port(host, port)
    if access.monitor_token is not None and configured is None:  # where, never what
        print(f"localserve: the monitor token is in {token_file(config.server)}", flush=True)
    with serving(config, name, access=access, models_file=config_path(args.config)) as served:
        say_where(served.runner)
        asyncio.run(run(served.server, host, port))
    return 0
