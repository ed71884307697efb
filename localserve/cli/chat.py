"""`localserve chat`: chat with a running server in this terminal.

tui is imported only when the command runs.

Tested in tests/unit/cli/test_cli.py and tests/e2e/test_terminal_chat.py.
"""

from __future__ import annotations

import argparse

from localserve.cli.shared import add_url_arguments, server_url


def add(sub) -> None:
    c = sub.add_parser("chat", help="chat with a running server in this terminal")
    add_url_arguments(c)
    c.add_argument("--name", help="your user name (default: $USER)")
    c.add_argument("--token", help="your token, when the server requires one")
    c.add_argument("--max-tokens", type=int, default=256)
    c.add_argument("--temperature", type=float, default=0.7)
    c.set_defaults(run=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    import asyncio
    import getpass

    from tui.chat import ChatClient

    name = args.name or getpass.getuser()
    client = ChatClient(server_url(args), name, args.token, args.max_tokens, args.temperature)
    return asyncio.run(client.run())
