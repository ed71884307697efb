"""What several commands share: the --model and server-URL arguments, the prefix-cache switch,
the team options of serve and usage, logging to a file under a full-screen app, and the
"what runs where" block with its GPU warning; the checks that catch a slip before the model
loads: the argument types (a port, a count, a URL, a list of numbers) argparse answers in one
line, an unknown model name, a port in use.

Tested in tests/unit/cli/test_shared.py and tests/e2e/test_cli_slips.py.
"""

from __future__ import annotations

import argparse
import errno
import logging
import math
import socket
import sys
import urllib.parse

import msgspec

log = logging.getLogger("localserve")

DEFAULT_URL = "ws://127.0.0.1:8765"
NO_PREFIX_CACHE_HELP = "keep no finished conversations' KV: every turn prefills its whole prompt"


# --- argument types: a slip is argparse's one line, before anything loads ---------------------


def port_number(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    value = _number(int, text, "a port")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535)")
    return value


def positive_int(text: str) -> int:
    """A count of at least 1."""
    value = _number(int, text, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def non_negative_float(text: str) -> float:
    """A number of at least 0 (a temperature, a pause)."""
    value = _number(float, text, "a number")
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a number of at least 0")
    return value


def positive_float(text: str) -> float:
    """A number above 0; inf allowed (a request rate: all at once)."""
    value = _number(float, text, "a number")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be above 0")
    return value


def counts(text: str) -> list[int]:
    """Comma-separated counts of at least 1 ("1,4,8")."""
    try:
        return [positive_int(item.strip()) for item in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected comma-separated whole numbers of at least 1, e.g. 1,4,8"
        ) from None


def _number(kind: type, text: str, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if kind is float and math.isnan(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def server_address(text: str) -> str:
    """A server's address as chat, monitor and bench take it (ws://, http://, host:port): its
    host and port checked here, so a typo is not a connection error later."""
    from localserve.websocket_client import websocket_url

    try:
        check_url(websocket_url(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def http_address(text: str) -> str:
    """An OpenAI-compatible server's http(s):// base URL."""
    if urllib.parse.urlsplit(text.strip()).scheme.lower() not in ("http", "https"):
        raise argparse.ArgumentTypeError(f"{text}: expected http://host:port or https://...")
    try:
        check_url(text.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def endpoint(text: str) -> str:
    """HOST:PORT (a `localserve worker`)."""
    host, sep, number = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT")
    port_number(number)
    return text


def check_url(url: str) -> None:
    """ValueError naming what is wrong with a URL's host or port."""
    parts = urllib.parse.urlsplit(url)
    try:
        number = parts.port
    except ValueError:
        raise ValueError(f"{url}: the port is not a number from 0 to 65535") from None
    if not parts.hostname or " " in parts.netloc:
        raise ValueError(f"{url}: no host in it (expected host:port, e.g. 127.0.0.1:8765)")
    if number == 0:
        raise ValueError(f"{url}: port 0 is not a server's port")


# --- arguments ---------------------------------------------------------------------------------


def add_model_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="a name from models.toml (default: its `default`)")


def add_url_arguments(p: argparse.ArgumentParser) -> None:
    """The server's URL, as `monitor URL` or `monitor --url URL` (the same for chat)."""
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "url",
        nargs="?",
        type=server_address,
        help="the server's address: ws://host:port, the http://host:port that `serve` prints, "
        f"or host:port (default {DEFAULT_URL})",
    )
    where.add_argument(
        "--url",
        dest="url_option",
        metavar="URL",
        type=server_address,
        help="the same, as an option",
    )


def server_url(args: argparse.Namespace) -> str:
    """The websocket URL asked for (http:// and host:port accepted: localserve.websocket_client)."""
    from localserve.websocket_client import websocket_url

    return websocket_url(args.url or args.url_option or DEFAULT_URL)


def model_name(config, name: str | None) -> str:
    """The model asked for (the config's default when None); ConfigError naming the known ones
    for a name the configuration does not have."""
    from localserve.config import configured_model

    return configured_model(config, name, "--model")


def check_port(host: str, port: int) -> None:
    """Bind host:port and let it go, before the model loads: a port in use (or an address this
    machine does not have) is a ConfigError naming it, not a traceback after the load."""
    from localserve.config import ConfigError

    try:  # every address the host resolves to, as asyncio's create_server binds them
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as e:
        why = getattr(e, "strerror", None) or e
        raise ConfigError(f"cannot listen on {host}:{port}: {why} (--host)") from None
    if port == 0:  # any free port: nothing to be in use
        return
    for family, kind, proto, _, address in addresses:
        _check_address(family, kind, proto, address, host, port)


def _check_address(family, kind, proto, address, host: str, port: int) -> None:
    from localserve.config import ConfigError

    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio does
        try:
            s.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"port {port} on {host} is already in use (another server?): "
                    "stop it, or pick another with --port"
                ) from None
            if e.errno == errno.EACCES:
                raise ConfigError(
                    f"port {port}: not allowed to listen on it (ports below 1024 need root): "
                    "pick another with --port"
                ) from None
            why = e.strerror or str(e)
            raise ConfigError(f"cannot listen on {host}:{port}: {why} (--host, --port)") from None


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
    """A full-screen app owns the terminal: logs go to a file instead, the server's (and the
    engine process's, which writes to the same file at the root's level) from INFO up — on a
    terminal only warnings show, but a file is read later, when something went wrong."""
    from localserve.runners.models import cache_dir

    path = cache_dir() / f"{name}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(min(root.level or logging.WARNING, logging.INFO))  # -v keeps DEBUG
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
