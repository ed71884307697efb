"""`localserve users`: the people of a users file and their tokens — add (a new random token
each, printed once), remove, list.

The server reads the file at start (`serve --users FILE`): restart it for a change to count.
The editing itself is ops/users_file.py's. Tested in tests/unit/cli/test_users.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_FILE = "users.toml"


def add(sub) -> None:
    u = sub.add_parser(
        "users",
        help="add, remove or list the people of a users file (their tokens)",
        description="The people who may use a server with tokens, in a users file (TOML, "
        "readable by its owner only): `add` gives each name a new random token and prints it "
        "once, `remove` takes names out, `list` names them. `serve --users FILE` reads the file "
        "at start: restart the server for a change to count.",
    )
    u.add_argument(
        "action", choices=("add", "remove", "list"), help="add people, remove them, or list them"
    )
    u.add_argument("names", nargs="*", metavar="NAME", help="the people (add, remove)")
    u.add_argument("--file", default=DEFAULT_FILE, help=f"the users file (default {DEFAULT_FILE})")
    u.set_defaults(run=cmd_users)


def cmd_users(args: argparse.Namespace) -> int:
    from localserve.ops import users_file

    path = Path(args.file)
    if args.action == "list":
        if args.names:
            raise ValueError("users list takes no names")
        for name in users_file.list_users(path):
            print(name)
        return 0
    if not args.names:
        raise ValueError(f"users {args.action}: give at least one name")
    mode = path.stat().st_mode & 0o777 if path.exists() else 0
    if args.action == "remove":
        users_file.remove_users(path, args.names)
        _tightened(path, mode)
        print(f"{path}: removed {', '.join(args.names)}; restart the server", file=sys.stderr)
        return 0
    tokens = users_file.add_users(path, args.names)
    _tightened(path, mode)
    width = max(len(name) for name in tokens)
    print(f"{path}: added, each with a token shown only now:", file=sys.stderr)
    for name, token in tokens.items():
        print(f"  {name:<{width}}  {token}")
    print("restart `localserve serve --users ...` for them to count", file=sys.stderr)
    return 0


def _tightened(path: Path, mode: int) -> None:
    """Said when the edit took away what the file gave others (its mode was `mode`)."""
    if mode & 0o007:
        now = path.stat().st_mode & 0o777
        print(f"{path}: others could read its tokens (mode {mode:o}); now {now:o}", file=sys.stderr)
