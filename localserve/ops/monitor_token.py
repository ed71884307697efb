"""The monitor token of a server with users: the one configured (--monitor-token, else the
users file's `[monitor] token`), else the one kept in the state directory's `monitor_token`,
created at the first start and readable only by its owner, so that `localserve monitor` run
by the same user on the same machine finds it by itself.

A tokenless server (loopback, or --open) keeps no file: its stats are open like its chat.

The file is trusted for nothing: never read through a link (O_NOFOLLOW), a FIFO or a device
refused without waiting for it, and it must be this user's and readable by nobody else; the
state directory is made private first (ops/state_dir.py).

Tested in tests/unit/ops/test_monitor_token.py and tests/e2e/test_monitor_credential.py.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from localserve.config import ConfigError, ServerConfig
from localserve.ops.state_dir import private_dir
from localserve.ops.usage import state_dir

FILE = "monitor_token"
MIN_LENGTH = 8  # as users' tokens


def token_file(config: ServerConfig) -> Path:
    """Where the server keeps its monitor token: `[server] state_dir`'s monitor_token."""
    return state_dir(config) / FILE


def server_monitor_token(
    configured: str | None, users: dict[str, str], config: ServerConfig
) -> str | None:
    """The server's monitor token: the configured one; else, on a server with users, the
    state directory's (created when there is none); None on a tokenless server."""
    if configured is not None:
        return configured
    if not users:
        return None
    return kept_token(token_file(config))


def kept_token(path: Path) -> str:
    """The token kept in `path`, created first when there is none (its directory private
    first: nobody else's file or link can be in its place)."""
    private_dir(path.parent)
    while (token := read_token(path)) is None:
        _create(path)
    return token


def read_token(path: Path) -> str | None:
    """The token kept in `path`; None when there is no such file. A ConfigError saying what
    to do for a file others may read or change, or one that holds no token."""
    try:  # no link followed; a FIFO or a device opened without waiting, then refused
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, encoding="utf-8", closefd=True) as f:
            found = os.fstat(f.fileno())
            mode = found.st_mode
            text = f.read(4096) if stat.S_ISREG(mode) else ""
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:  # a link in its place: planted, it would choose the token
            raise ConfigError(
                f"{path}: a link in the monitor token's place (never followed): remove it "
                "(the server makes a new token)"
            ) from None
        raise ConfigError(f"{path}: cannot read the monitor token: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: cannot read the monitor token: {e}") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{path}: not a file: move it aside (the server makes a new token)")
    if found.st_uid != os.geteuid():
        raise ConfigError(
            f"{path}: the monitor token belongs to another user (uid {found.st_uid}): delete "
            "it and restart the server for a new one"
        )
    if mode & 0o077:
        raise ConfigError(
            f"{path}: others may read this monitor token (mode {mode & 0o777:o}): "
            f"`chmod 600 {path}`, or delete it and restart the server for a new one"
        )
    token = text.strip()
    if len(token) < MIN_LENGTH or not token.isprintable():
        raise ConfigError(
            f"{path}: holds no monitor token ({MIN_LENGTH}+ printable characters): delete it "
            "and restart the server for a new one"
        )
    return token


def _create(path: Path) -> None:
    """A new random token in `path`, mode 0600, whole before it appears (written aside, then
    linked in); a file another process linked first is left as it is."""
    private_dir(path.parent)  # others cannot put a file or a link in its place
    try:
        aside = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(secrets.token_hex(32) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.link(aside, path)  # atomic, and never over another's
        except FileExistsError:
            pass
        finally:
            os.unlink(aside)
    except OSError as e:
        raise ConfigError(f"{path}: cannot create the monitor token: {e.strerror or e}") from None
