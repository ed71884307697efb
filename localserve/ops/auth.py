"""Who may connect: per-user tokens, the monitor token, and the bind-address rule.

Bound to loopback, the server needs no tokens (everyone on the machine may chat). Bound to any
other address it refuses to start without per-user tokens, unless told it is open on purpose.
Tokens come from a users file (TOML: `[users]` table of name = "token") or from
$LOCALSERVE_USERS ("alice:token1,bob:token2"). Tokens are compared as UTF-8 bytes in constant
time, whatever their characters. Failed authentications are counted per client address and
what was claimed (a user name, an API key, the monitor token), and per wrong token (a salted
hash): past a cap per minute a wrong token is refused at once, and guessing many tokens is
slowed to the cap's rate, while the right token still passes (see AuthThrottle).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import time
import tomllib
from collections import deque
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from localserve.config import ConfigError, loads_toml

MAX_USER_NAME = 64


def load_users(path: str | None = None) -> dict[str, str]:
    """Users and their tokens from the file, else the environment; {} when neither is set."""
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: no such users file")
        raw = loads_toml(p.read_text(encoding="utf-8"), str(p))
        users = raw.get("users")
        if not isinstance(users, dict) or not all(isinstance(t, str) for t in users.values()):
            raise ConfigError(f'{p}: `users`: expected a table of name = "token"')
        return _checked(users, str(p))
    env = os.environ.get("LOCALSERVE_USERS", "")
    pairs = [item.split(":", 1) for item in env.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise ConfigError("LOCALSERVE_USERS: expected name:token pairs separated by commas")
    return _checked({name.strip(): token.strip() for name, token in pairs}, "LOCALSERVE_USERS")


def check_users_file_private(path: str | None) -> None:
    """A users file others may read (or write) holds every token in the open: ConfigError,
    saying what to do (its owner and group may: a service's group reads it)."""
    if not path:
        return
    mode = Path(path).stat().st_mode & 0o777
    if mode & 0o007:
        raise ConfigError(
            f"{path}: others may read these tokens (mode {mode:o}): `chmod o-rwx {path}` "
            "(`localserve users add` and `remove` tighten it too)"
        )


def load_daily_tokens(path: str | None) -> dict[str, int]:
    """A users file's optional `[daily_tokens]` table: name = tokens a day (quotas)."""
    if not path:
        return {}
    quotas = _table(path, "daily_tokens")
    if not isinstance(quotas, dict) or not all(
        isinstance(q, int) and not isinstance(q, bool) and q >= 0 for q in quotas.values()
    ):
        raise ConfigError(f"{path}: `daily_tokens`: expected a table of name = tokens (>= 0)")
    return quotas


def load_monitor_token(path: str | None) -> str | None:
    """A users file's optional `[monitor]` table: `token = "..."`, the monitor token."""
    if not path:
        return None
    monitor = _table(path, "monitor")
    token = monitor.get("token") if isinstance(monitor, dict) else None
    if (
        not isinstance(monitor, dict)
        or set(monitor) - {"token"}
        or not (token is None or (isinstance(token, str) and len(token) >= 8))
    ):
        raise ConfigError(f'{path}: `monitor`: expected token = "..." (at least 8 characters)')
    return token


def _table(path: str, key: str) -> object:
    """One table of a users file that load_users has read (so it exists and is TOML)."""
    return tomllib.loads(Path(path).read_text(encoding="utf-8")).get(key, {})


def monitor_refusal(needs: str, token: str | None) -> str:
    """Why a monitor token was refused, in one line: none was sent, or a wrong one."""
    return f"{needs}: {'the one sent is wrong' if token else 'none was sent'}"


def _checked(users: dict[str, str], source: str) -> dict[str, str]:
    for name, token in users.items():
        if not check_user_name(name):
            raise ConfigError(f"{source}: user {name!r}: 1-{MAX_USER_NAME} printable characters")
        if len(token) < 8:
            raise ConfigError(f"{source}: user {name!r}: tokens need at least 8 characters")
    return users


def check_user_name(name: str) -> bool:
    return 0 < len(name) <= MAX_USER_NAME and name.isprintable() and name.strip() == name


def check_frontends(trusted: list[str], users: dict[str, str]) -> None:
    """`[server] trusted_frontends` against the users: only on a server with tokens (a front-end
    is known by its API key), only known users, and no user named like one of their people."""
    key = "[server] trusted_frontends"
    if trusted and not users:
        raise ConfigError(
            f"{key}: needs a server with tokens (a users file, --users, or $LOCALSERVE_USERS): "
            "a front-end is known by its API key"
        )
    for name in trusted:
        if name not in users:
            raise ConfigError(f"{key}: {name!r} is not a user of the users file")
        if taken := [u for u in users if u.startswith(name + "/")]:
            raise ConfigError(f"{key}: the user {taken[0]!r} would be one of {name!r}'s people")


def is_known_user(name: str, users: dict[str, str], trusted: list[str]) -> bool:
    """A user of the users file, or a person of a trusted front-end ("openwebui/alice")."""
    frontend, sep, person = name.partition("/")
    return name in users or bool(sep and person and frontend in trusted)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Access:
    """Token checks for hello, subscribe, /metrics and the HTTP API's keys."""

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
        return _same_token(self.users.get(user), token)

    def user_for_token(self, token: str | None) -> str | None:
        """The user whose token this is (an HTTP API key); every token is compared."""
        found = None
        for user, expected in self.users.items():
            if _same_token(expected, token):
                found = user
        return found

    def allows_monitor(self, token: str | None) -> bool:
        """Stats and /metrics show every user's traffic: they need the monitor token when the
        server has one (a server with users always has: ops/monitor_token.py), else they are
        open, like the tokenless server's chat."""
        if self.monitor_token is not None:
            return _same_token(self.monitor_token, token)
        return not self.users


DEFAULT_PORTS = {"http": 80, "https": 443}


def browser_refusal(
    headers: list[tuple[bytes, bytes]], allowed_origins: list[str], allowed_hosts: list[str]
) -> str | None:
    """Why a request from a web browser is refused, or None when it may go on.

    Browsers let any web page open a websocket to any address and send simple POSTs anywhere,
    so a page on the internet that someone in the house visits could chat through (or read the
    stats of) a server that needs no token. Two rules stop that:

    - the page must be this server's own (its origin's host and port are the Host header's) or
      listed in `allowed_origins`;
    - the server must be addressed by a name it knows: an IP address, `localhost`, or a name in
      `allowed_hosts`. Otherwise a page could rename itself (DNS rebinding: its name made to
      resolve to this server) and be "this server's own".

    Only browsers send `Origin` or `Sec-Fetch-Site`: other clients (scripts, the openai
    package, curl) are not affected, whatever name they use.
    """
    origin = host = fetch_site = None
    for name, value in headers:
        if name == b"origin":
            origin = value.decode("latin-1").strip()
        elif name == b"host":
            host = value.decode("latin-1").strip()
        elif name == b"sec-fetch-site":
            fetch_site = value
    if origin is None and fetch_site is None:
        return None
    if origin is not None and normal_origin(origin) in allowed_origins:
        return None
    server = _split("//" + (host or ""), "http" if origin is None else origin.split(":", 1)[0])
    if server is None or not _known_host(server[0], allowed_hosts):
        name = server[0] if server else host
        return (
            f"refused: this server does not go by the name {name!r} in a browser; open it by "
            "its IP address or localhost, or add the name to [server] allowed_hosts"
        )
    if origin is not None and _split(origin.lower(), None) != server:
        return (
            "refused: a web page from another origin may not use this server "
            "(add it to [server] allowed_origins if it should)"
        )
    return None


def normal_origin(origin: str) -> str:
    """An origin as browsers send it: lower case, no trailing slash."""
    return origin.strip().lower().rstrip("/")


def _split(address: str, scheme: str | None) -> tuple[str, int] | None:
    """(host, port) of an origin ("http://h:p"), or of "//host:port" under `scheme`."""
    try:
        parts = urlsplit(address)
        port = parts.port
    except ValueError:
        return None
    scheme = scheme or parts.scheme
    if not parts.hostname or scheme not in DEFAULT_PORTS or parts.path not in ("", "/"):
        return None
    return parts.hostname.rstrip("."), port or DEFAULT_PORTS[scheme]


def _known_host(host: str, allowed_hosts: list[str]) -> bool:
    if host == "localhost" or host.endswith(".localhost") or host in allowed_hosts:
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def address_group(address: str) -> str:
    """The throttle's notion of one place: all of loopback is one, an IPv6 /64 is one (a
    single host is usually given a whole /64, so counting addresses in it would count nothing).
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _same_token(expected: str | None, given: str | None) -> bool:
    """Constant-time comparison of the UTF-8 bytes (compare_digest refuses non-ASCII str)."""
    if expected is None or given is None:
        return False
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogatepass"))


class AuthThrottle:
    """Failed authentications over a sliding window, per key (the server's: an address group
    and what was claimed, a user name or "api key" or "monitor") and per credential tried under
    a key (only a salted hash of it is kept).

    - A credential that failed `max_failures` times within `window_s` is refused at once
      (`retry_after`): a wrong client retrying. Its repeats count once toward its key.
    - A key with `max_failures` different wrong credentials in the window is locked: each
      further attempt under it waits its turn (`turn`), one every window_s / max_failures
      seconds (the cap's own rate) but at most `max_turn_s` (a hello must be answered within
      10 s), and only then is its credential's check answered: a right one passes, a wrong one
      is refused. So guessing stays near the cap's rate, and a client with the right token is
      only slowed. An attempt whose turn is further off than one interval (another is
      waiting) is refused unchecked.
    - A credential that passed under a key skips its turns for `good_s` (`passed`,
      `is_known_good`): a client already in is not slowed by someone guessing beside it.

    Each table keeps at most `max_keys` entries (the least recently failing are forgotten
    first), so clients with many addresses, names or tokens cannot grow it without bound.
    """

    def __init__(
        self,
        max_failures: int,
        window_s: float = 60.0,
        max_keys: int = 4096,
        clock: Callable[[], float] = time.monotonic,
        max_turn_s: float = 5.0,
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.max_keys = max_keys
        self.max_turn_s = max_turn_s
        self.clock = clock
        self.num_failures = 0  # since start, for /metrics
        self.num_throttled = 0  # attempts the throttle delayed or refused
        self._salt = secrets.token_bytes(16)
        self._failures: dict[str, deque[float]] = {}  # by key
        self._credentials: dict[str, deque[float]] = {}  # by key and credential hash
        self._turns: dict[str, float] = {}  # a locked key's latest turn
        self._good: dict[str, float] = {}  # credential hashes that passed, when (bounded too)
        self.good_s = 3600.0  # how long a passed credential skips a locked key's turns

    @property
    def interval_s(self) -> float:
        """How often a locked key's attempts are checked."""
        return min(self.window_s / self.max_failures, self.max_turn_s)

    def credential(self, key: str, secret: str | None) -> str:
        """The entry of this credential under this key: a salted hash, never the token."""
        given = (secret or "").encode("utf-8", "surrogatepass")
        return f"{key} {hmac.new(self._salt, given, 'sha256').hexdigest()[:32]}"

    def passed(self, credential: str) -> None:
        """This credential passed under its key: it skips the key's turns for good_s."""
        _remember(self._good, credential, self.clock(), self.max_keys)

    def is_known_good(self, credential: str) -> bool:
        """This credential passed under its key within good_s."""
        at = self._good.get(credential)
        return at is not None and self.clock() - at < self.good_s

    def has_failed(self, credential: str) -> bool:
        """This credential failed under its key within the window."""
        return bool(self._recent(self._credentials, credential))

    def retry_after(self, credential: str) -> float:
        """Seconds before this (failing) credential is checked again; 0 = go ahead."""
        times = self._recent(self._credentials, credential)
        if len(times) < self.max_failures:
            return 0.0
        self.num_throttled += 1
        return times[-self.max_failures] + self.window_s - self.clock()

    def turn(self, key: str) -> float:
        """Seconds this attempt waits before its check is answered: 0 unless the key is
        locked. More than `interval_s`: no turn was given (another waits), refuse it."""
        times = self._recent(self._failures, key)
        if len(times) < self.max_failures:
            return 0.0
        now = self.clock()
        at = max(now, max(self._turns.get(key, 0.0), times[-1]) + self.interval_s)
        if at - now <= self.interval_s:
            _remember(self._turns, key, at, self.max_keys)
        if at > now:
            self.num_throttled += 1
        return at - now

    def failed(self, key: str, credential: str) -> None:
        """Count one failed attempt of this credential under this key."""
        self.num_failures += 1
        if not self.has_failed(credential):  # the same wrong token again is not guessing
            self._add(self._failures, key)
        self._add(self._credentials, credential)

    def _add(self, table: dict[str, deque[float]], key: str) -> None:
        times = table.pop(key, None) or deque(maxlen=self.max_failures)
        times.append(self.clock())
        _remember(table, key, times, self.max_keys)

    def _recent(self, table: dict[str, deque[float]], key: str) -> deque[float]:
        times = table.get(key, deque())
        horizon = self.clock() - self.window_s
        while times and times[0] <= horizon:
            times.popleft()
        return times


def _remember(table: dict, key: str, value, max_keys: int) -> None:
    """Set table[key] as its most recent entry; forget the oldest past max_keys."""
    table.pop(key, None)
    table[key] = value
    while len(table) > max_keys:
        del table[next(iter(table))]
