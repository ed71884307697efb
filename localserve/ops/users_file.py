"""Editing a users file (`localserve users`): add people with new random tokens, remove them,
list them.

The file stays one a person reads and edits by hand: lines are added to (or taken out of) its
`[users]` table and every other line — comments, `[daily_tokens]`, the rest — is kept as it was.
The result is read back as TOML and must hold exactly the users meant before anything is
written; then it is written whole to a temporary file beside it and renamed over it, so a crash
leaves the old file or the new one, never half of one. A new file is readable by its owner only
(0600: the tokens are secrets); an existing one keeps its owner and group (a service's) and
its mode, less what it gave others: a file others could read is tightened (`serve` refuses it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import tempfile
import tomllib
from pathlib import Path

from localserve.config import ConfigError, loads_toml
from localserve.ops.auth import MAX_USER_NAME, check_user_name, load_users

TOKEN_BYTES = 24  # 32 characters of URL-safe base64: 192 random bits
_HEADER = re.compile(r"^[ \t]*\[[ \t]*(\"?)users\1[ \t]*\][ \t]*(#.*)?$")
_ANY_HEADER = re.compile(r"^[ \t]*\[")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def new_token() -> str:
    return secrets.token_hex(TOKEN_BYTES)


def list_users(path: Path) -> list[str]:
    """The names in the file, in its order (never their tokens)."""
    return list(load_users(str(path)))


def add_users(path: Path, names: list[str]) -> dict[str, str]:
    """Give each name a new token in the file (created when missing); the names and tokens.
    A name the file has, a name given twice or one the server would refuse: ConfigError, and
    nothing is written."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    known = _users_of(text, path) if text.strip() else {}
    for name in names:
        if not check_user_name(name):
            raise ConfigError(f"{name!r}: a user name is 1-{MAX_USER_NAME} printable characters")
        if name in known:
            raise ConfigError(
                f"{path}: {name!r} is there already (remove it first for a new token)"
            )
    if len(set(names)) != len(names):
        raise ConfigError("a name is given twice")
    tokens = {name: new_token() for name in names}
    lines = [f'{_key(name)} = "{token}"' for name, token in tokens.items()]
    _write(path, _inserted(text, lines), known=dict(known, **tokens))
    return tokens


def remove_users(path: Path, names: list[str]) -> None:
    """Take the names (and their tokens) out of the file's `[users]` table."""
    if not path.exists():
        raise ConfigError(f"{path}: no such users file")
    text = path.read_text(encoding="utf-8")
    known = _users_of(text, path)
    if missing := [n for n in names if n not in known]:
        raise ConfigError(f"{path}: no user {missing[0]!r} (it has {', '.join(known) or 'none'})")
    lines = text.splitlines(keepends=True)
    start, end = _table(lines)
    kept = [
        line for i, line in enumerate(lines) if not (start < i < end and _line_key(line) in names)
    ]
    _write(path, "".join(kept), known={n: t for n, t in known.items() if n not in names})


def _users_of(text: str, path: Path) -> dict[str, str]:
    users = loads_toml(text, str(path)).get("users", {})
    if not isinstance(users, dict):
        raise ConfigError(f'{path}: `users`: expected a table of name = "token"')
    return users


def _key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else json.dumps(name, ensure_ascii=False)


def _table(lines: list[str]) -> tuple[int, int]:
    """The `[users]` header's line and the line after the table's last (-1, 0: none)."""
    start = next((i for i, line in enumerate(lines) if _HEADER.match(line.rstrip("\r\n"))), -1)
    if start < 0:
        return -1, 0
    end = next((i for i in range(start + 1, len(lines)) if _ANY_HEADER.match(lines[i])), len(lines))
    return start, end


def _inserted(text: str, new: list[str]) -> str:
    """`text` with the lines at the end of its `[users]` table (a new table at the end when it
    has none)."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    start, end = _table(lines)
    added = [line + "\n" for line in new]
    if start < 0:
        head = ["\n"] if lines and lines[-1].strip() else []
        return "".join(lines + head + ["[users]\n"] + added)
    while end - 1 > start and not lines[end - 1].strip():  # before the blank lines that end it
        end -= 1
    return "".join(lines[:end] + added + lines[end:])


def _line_key(line: str) -> str | None:
    """The key of a `name = "token"` line, else None."""
    try:
        parsed = tomllib.loads(line)
    except tomllib.TOMLDecodeError:
        return None
    return next(iter(parsed)) if len(parsed) == 1 else None


def _write(path: Path, text: str, known: dict[str, str]) -> None:
    """Check `text` reads as `known` (the server's own reading), then replace the file."""
    try:
        users = tomllib.loads(text).get("users")
    except tomllib.TOMLDecodeError:
        users = None
    if users != known:  # an inline table, dotted keys: the edit would break or miss it
        raise ConfigError(
            f"{path}: its [users] table is not one this command edits; edit it by hand"
        )
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            st = path.stat()
            os.chmod(tmp, st.st_mode & 0o770)  # nothing for others: the tokens are secrets
            with contextlib.suppress(PermissionError):  # not root: the file stays ours
                os.chown(tmp, st.st_uid, st.st_gid)
        else:
            os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
