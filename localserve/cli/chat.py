"""`localserve chat`: chat with a running server in this terminal.

The token comes from --token, --token-file or $LOCALSERVE_TOKEN (a command line shows in
`ps`; the other two do not). tui is imported only when the command runs.

Tested in tests/unit/cli/test_cli.py and tests/e2e/test_terminal_chat.py.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from localserve.cli.shared import (
    add_url_arguments,
    non_negative_float,
    positive_int,
    server_url,
)
from localserve.config import ConfigError
from localserve.protocol.frames import CONVERSATION_ID

TOKEN_VARIABLE = "LOCALSERVE_TOKEN"
MAX_TOKEN_CHARS = 4096  # --token-file: its first line, at most this long


def add(sub) -> None:
    c = sub.add_parser(
        "chat",
        help="chat with a running server in this terminal",
        description="Chat with a running server in this terminal. /help lists the client's "
        "commands; Ctrl-C stops a reply, and at the prompt leaves (status 0). With standard "
        "input from a file or a pipe, each line is a message and the replies are printed.",
    )
    add_url_arguments(c)
    c.add_argument("--name", help="your user name (default: $USER)")
    c.add_argument(
        "--model", help="the server's model to talk to (default: its default; /model lists them)"
    )
    token = c.add_mutually_exclusive_group()
    token.add_argument(
        "--token",
        help=f"your token, when the server requires one (default: ${TOKEN_VARIABLE}); "
        "visible to others in `ps`: prefer --token-file or the variable",
    )
    token.add_argument("--token-file", metavar="FILE", help="read the token from this file")
    c.add_argument(
        "--max-tokens",
        type=positive_int,
        default=256,
        help="tokens per reply at most (default %(default)s)",
    )
    c.add_argument(
        "--temperature",
        type=non_negative_float,
        default=0.7,
        help="0 = greedy (default %(default)s)",
    )
    c.add_argument(
        "--resume",
        nargs="?",
        const="",
        metavar="ID",
        help="go on with one of your conversations kept on the server (a server with users): "
        "this id, or without one the newest; /chats lists them",
    )
    c.set_defaults(run=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    import asyncio
    import getpass

    from tui.chat import ChatClient

    name = args.name or getpass.getuser()
    url = server_url(args)
    resume = resume_id(args)
    client = ChatClient(
        url,
        name,
        chat_token(args),
        args.max_tokens,
        args.temperature,
        echo=not sys.stdin.isatty(),  # lines from a file or a pipe: show them with the replies
        err=sys.stderr,
        model=args.model,
        resume=resume,
    )
    return asyncio.run(client.run())


def chat_token(args: argparse.Namespace) -> str | None:
    """--token, else the first line of --token-file, else $LOCALSERVE_TOKEN, else None."""
    if args.token:
        return args.token
    if args.token_file:
        try:  # a token is a line: read no more than one (a huge file or /dev/zero is no token)
            with Path(args.token_file).expanduser().open(encoding="utf-8") as f:
                text = f.readline(MAX_TOKEN_CHARS)
        except OSError as e:
            why = f"cannot read {args.token_file}: {e.strerror}"
            raise ConfigError(f"--token-file: {why}") from None
        if not text.strip():
            raise ConfigError(f"--token-file: {args.token_file} is empty")
        return text.strip().splitlines()[0].strip()
    return os.environ.get(TOKEN_VARIABLE) or None


def resume_id(args: argparse.Namespace) -> str | None:
    """--resume's id ("" for the newest, None without --resume); ConfigError for one that
    cannot be an id (an address after --resume is taken for one: put it first)."""
    if args.resume and not re.fullmatch(CONVERSATION_ID, args.resume):
        shown = args.resume if len(args.resume) <= 40 else args.resume[:39] + "…"
        raise ConfigError(
            f"--resume: {shown!r} is not a conversation id (letters, digits, _ and -; "
            "an address goes before --resume)"
        )
    return args.resume
