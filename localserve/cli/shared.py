"""What several commands share: the --model and server-URL arguments, the prefix-cache switch,
the team options of serve and usage, logging to a file under a full-screen app, and the
"what runs where" block with its GPU warning.
"""

from __future__ import annotations

import argparse
import logging
import sys

import msgspec

log = logging.getLogger("localserve")

DEFAULT_URL = "ws://127.0.0.1:8765"
NO_PREFIX_CACHE_HELP = "keep no finished conversations' KV: every turn prefills its whole prompt"


def add_model_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="a name from models.toml (default: its `default`)")


def add_url_arguments(p: argparse.ArgumentParser) -> None:
    """The server's URL, as `monitor URL` or `monitor --url URL` (the same for chat)."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("url", nargs="?", help=f"the server's websocket URL (default {DEFAULT_URL})")
    where.add_argument("--url", dest="url_option", metavar="URL", help="the same, as an option")


def server_url(args: argparse.Namespace) -> str:
    return args.url or args.url_option or DEFAULT_URL


def prefix_cache_option(config, no_prefix_cache: bool):
    """The config, with prefix caching turned off if asked."""
    if not no_prefix_cache:
        return config
    scheduler = msgspec.structs.replace(config.scheduler, prefix_caching=False)
    return msgspec.structs.replace(config, scheduler=scheduler)


def team_options(server, args: argparse.Namespace, daily_tokens: dict[str, int]):
    """[server] with the command line's state directory and access log, and the users file's
    quotas over models.toml's."""
    changes: dict = {"daily_tokens_per_user": server.daily_tokens_per_user | daily_tokens}
    if getattr(args, "state_dir", None):
        changes["state_dir"] = args.state_dir
    if getattr(args, "access_log", None):
        changes["access_log"] = args.access_log
    return msgspec.structs.replace(server, **changes)


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
    warning = gpu_warning()
    if warning:
        print(warning, file=sys.stderr, flush=True)
        log.warning("%s", warning)


def gpu_warning() -> str | None:
    """The warning for an NVIDIA GPU that this llama.cpp build cannot offload to, else None."""
    from localserve.runners.placement import gpu_without_offload
    from localserve.runners.rpc import has_local_gpu

    return gpu_without_offload(has_local_gpu())
