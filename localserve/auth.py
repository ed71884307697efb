"""Who may connect: per-user tokens, the monitor token, and the bind-address rule.

Bound to loopback, the server needs no tokens (everyone on the machine may chat). Bound to any
other address it refuses to start without per-user tokens, unless told it is open on purpose.
Tokens come from a users file (TOML: `[users]` table of name = "token") or from
$LOCALSERVE_USERS ("alice:token1,bob:token2").
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import tomllib
from pathlib import Path

from localserve.config import ConfigError

MAX_USER_NAME = 64


def load_users(path: str | None = None) -> dict[str, str]:
    """Users and their tokens from the file, else the environment; {} when neither is set."""
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: no such users file")
        try:
            raw = tomllib.loads(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML: {e}") from None
        users = raw.get("users")
        if not isinstance(users, dict) or not all(isinstance(t, str) for t in users.values()):
            raise ConfigError(f'{p}: `users`: expected a table of name = "token"')
        return _checked(users, str(p))
    env = os.environ.get("LOCALSERVE_USERS", "")
    pairs = [item.split(":", 1) for item in env.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise ConfigError("LOCALSERVE_USERS: expected name:token pairs separated by commas")
    return _checked({name.strip(): token.strip() for name, token in pairs}, "LOCALSERVE_USERS")


def _checked(users: dict[str, str], source: str) -> dict[str, str]:
    for name, token in users.items():
        if not check_user_name(name):
            raise ConfigError(f"{source}: user {name!r}: 1-{MAX_USER_NAME} printable characters")
        if len(token) < 8:
            raise ConfigError(f"{source}: user {name!r}: tokens need at least 8 characters")
    return users


def check_user_name(name: str) -> bool:
    return 0 < len(name) <= MAX_USER_NAME and name.isprintable() and name.strip() == name


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Access:
    """Token checks for hello and subscribe."""

    def __init__(self, users: dict[str, str], monitor_token: str | None = None) -> None:
        self.users = users
        self.monitor_token = monitor_token

    @property
    def requires_tokens(self) -> bool:
        return bool(self.users)

    def check_bind(self, host: str, is_open: bool) -> None:
        """Refuse a network bind without tokens unless explicitly open."""
        if not is_loopback(host) and not self.users and not is_open:
            raise ConfigError(
                f"refusing to listen on {host} without per-user tokens: give a users file "
                "(--users) or $LOCALSERVE_USERS, or pass --open if anyone may connect"
            )

    def allows_user(self, user: str, token: str | None) -> bool:
        if not self.users:
            return True
        expected = self.users.get(user)
        return expected is not None and token is not None and hmac.compare_digest(expected, token)

    def allows_monitor(self, token: str | None) -> bool:
        """Stats show every user's requests: open only on a tokenless (loopback) server."""
        if self.monitor_token is not None:
            return token is not None and hmac.compare_digest(self.monitor_token, token)
        return not self.users
