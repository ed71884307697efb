"""The `localserve` command line: `main()` and the parser it reads, assembled from one module per
command. Each command module has `add(subparsers)`, which adds its subcommand and sets `run` to
the function that does it; what several commands share is in localserve.cli.shared.

Nothing here imports tui or Textual: demo, monitor and chat import tui inside their run
functions only.

- `serve.py`: `localserve serve`: the chat server on one port.
- `worker.py`: `localserve worker`: this machine's CPU or GPUs lent as a llama.cpp RPC server.
- `demo.py`: `localserve demo`: the model in-process, four people sharing it, the monitor.
- `monitor.py`: `localserve monitor`: the live monitor of a running server.
- `chat.py`: `localserve chat`: chat with a running server in this terminal.
- `users.py`: `localserve users`: the people of a users file and their tokens.
- `usage.py`: `localserve usage`: who used how much of which model, per user and day.
- `generate.py`: `localserve generate`: one prompt through the engine, its timings after.
- `models.py`: `localserve models`: the configured models, their files, what fits.
- `pull.py`: `localserve pull`: a GGUF fetched from the Hugging Face Hub into models.toml.
- `bench.py`: `localserve bench`: the load generator against a running server.
- `sweep.py`: `localserve sweep`: concurrency x workload x policy on one loaded model.
- `bench_engine.py`: `localserve bench-engine`: the engine against bare llama_decode.
- `shared.py`: what several commands share: arguments, logging, the "what runs where" block.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import select
import sys

from localserve.cli import (
    bench,
    bench_engine,
    chat,
    demo,
    generate,
    models,
    monitor,
    pull,
    serve,
    sweep,
    usage,
    users,
    worker,
)
from localserve.config import ConfigError

DESCRIPTION = (
    "`localserve` command line: serve a model (serve, worker), share and watch it (demo, "
    "monitor, chat), give people tokens (users), account for it (usage), try it (generate, "
    "models, pull) and measure it (bench, sweep, bench-engine). `serve` answers on one port: "
    "the chat page (/), websocket chat, the OpenAI API (/v1), the Ollama API (/api), the "
    "Anthropic API (/v1/messages), /healthz and /metrics."
)

CONFIG_HELP = "models.toml (default: $LOCALSERVE_MODELS or ./models.toml)"

# in the order `localserve --help` lists them
COMMANDS = (
    chat,
    demo,
    monitor,
    serve,
    worker,
    users,
    usage,
    generate,
    models,
    pull,
    bench,
    sweep,
    bench_engine,
)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # llama.cpp warns about harmless model quirks at every load; -v shows them
    logging.getLogger("llama_cpp").setLevel(logging.DEBUG if args.verbose else logging.ERROR)
    # each model's load, swap and unload, with its time: one line on the console (serve/pool.py)
    logging.getLogger("localserve.serve.pool").setLevel(
        logging.DEBUG if args.verbose else logging.INFO
    )
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        status = args.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return status
    except (ConfigError, ValueError) as e:
        print(f"localserve: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        if not _stdout_gone():  # a socket, not our reader: a real failure, not a quiet stop
            raise
        return _pipe_closed()


def _stdout_gone() -> bool:
    """Standard output is a pipe whose reader has left (poll says POLLERR)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError):
        return False


def _pipe_closed() -> int:
    """Standard output's reader left (`localserve usage --json | head`): stop quietly, with the
    status of a tool that SIGPIPE ended (128 + 13), and nothing more written to the pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # so the flush at exit does not fail again
    return 141


def version_text() -> str:
    """localserve's version and the llama-cpp-python it would use, read from the package
    metadata: importing llama_cpp loads llama.cpp's libraries, too slow for --version."""
    from localserve import __version__

    try:
        llama = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        llama = "not installed"
    return f"localserve {__version__} (llama-cpp-python {llama})"


class Parser(argparse.ArgumentParser):
    """argparse's parser, with a slip said in one line and no usage block before it (every
    command's subparser is one too: argparse makes them of their parent's class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: the global options, then every command's subparser."""
    p = Parser(prog="localserve", description=DESCRIPTION)
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging, llama.cpp's too")
    p.add_argument("-V", "--version", action="version", version=version_text())
    sub = p.add_subparsers(title="commands")
    for command in COMMANDS:
        command.add(sub)
    for command_parser in sub.choices.values():  # before or after the command, both work
        command_parser.add_argument("--config", default=argparse.SUPPRESS, help=CONFIG_HELP)
    return p
