"""The usage database: its schema and migrations, opened checked, its rows read back.

`usage.sqlite3` in the state directory holds one row per finished request (`Row`). `connect`
opens it for the server's writer (ops/usage.py: created private, WAL, `synchronous = FULL`,
migrated to SCHEMA_VERSION) or read-only for `localserve usage` (ops/usage_report.py); a file
that cannot be used (corrupt, another program's, newer, read-only, locked) is a UsageError
naming it and saying what to do, said at start-up, before anyone connects.

Tested in tests/unit/ops/test_usage.py and through the server in tests/e2e/test_usage_record.py.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from localserve.config import ConfigError
from localserve.ops.state_dir import no_link, private_dir
from localserve.protocol.frames import UserUsage

log = logging.getLogger("localserve.ops.usage")  # the usage record's logger, as before

DATABASE = "usage.sqlite3"
LOCK_TIMEOUT_S = 5.0  # waiting for another writer (a second server on the same state dir)

# Each entry brings the schema from the version before it (PRAGMA user_version) to its own.
MIGRATIONS: list[list[str]] = [
    [  # 1
        """CREATE TABLE requests (
            id INTEGER PRIMARY KEY,
            finished REAL NOT NULL,          -- unix time the request ended
            user TEXT NOT NULL,
            model TEXT NOT NULL,
            request_id TEXT NOT NULL,        -- the server's id (as in the monitor and logs)
            client_id TEXT NOT NULL,         -- the id the client gave it
            api TEXT NOT NULL,               -- websocket | http | ollama | anthropic
            prompt_tokens INTEGER NOT NULL,
            cached_tokens INTEGER NOT NULL,  -- of prompt_tokens: reused, not computed
            completion_tokens INTEGER NOT NULL,
            queue_ms REAL,
            ttft_ms REAL,
            e2e_ms REAL,
            finish_reason TEXT NOT NULL,     -- stop | length | cancelled | error
            day TEXT NOT NULL                -- the server's local date then: YYYY-MM-DD
        )""",
        # covers the reports and the start-up totals: read from the index alone, in time order
        """CREATE INDEX requests_by_time ON requests (finished, day, user, prompt_tokens,
            cached_tokens, completion_tokens, ttft_ms)""",
        "CREATE INDEX requests_by_user ON requests (user, finished)",
    ],
]
SCHEMA_VERSION = len(MIGRATIONS)


class UsageError(ConfigError):
    """The usage database cannot be used: said at start-up, before anyone connects."""


@dataclasses.dataclass(frozen=True)
class Row:
    finished: float
    user: str
    model: str
    request_id: str
    client_id: str
    api: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue_ms: float | None
    ttft_ms: float | None
    e2e_ms: float | None
    finish_reason: str

    @property
    def counted_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens + self.completion_tokens

    @property
    def day(self) -> str:
        return datetime.date.fromtimestamp(self.finished).isoformat()

    def values(self) -> tuple:
        """In the order of INSERT's columns."""
        return (*dataclasses.astuple(self), self.day)


COLUMN_NAMES = tuple(f.name for f in dataclasses.fields(Row))  # the table's, but `day`
COLUMNS = ", ".join(COLUMN_NAMES)
INSERT = (
    f"INSERT INTO requests ({COLUMNS}, day) VALUES ({', '.join('?' * (len(COLUMN_NAMES) + 1))})"
)


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection to the usage database, checked: a corrupt, foreign, newer, read-only or
    locked file is a UsageError naming it and saying what to do."""
    if path.exists() and not path.is_file():
        raise UsageError(f"{path}: not a file: move it aside or set [server] state_dir")
    if readonly and not path.is_file():
        raise UsageError(f"{path}: no usage database here (has the server recorded any?)")
    if not readonly:
        try:  # a private directory, no link in the record's place (ops/state_dir.py)
            private_dir(path.parent)
            no_link(path, "the usage record")
        except ConfigError as e:
            raise UsageError(str(e)) from None
    db = None
    try:
        if readonly:
            db = _open_readonly(path)
        else:
            created = not path.exists()
            db = sqlite3.connect(path, timeout=LOCK_TIMEOUT_S, check_same_thread=False)
            if created:
                os.chmod(path, 0o600)  # who asked what, and how much: the operator's only
        _check(db, path, readonly)
    except sqlite3.OperationalError as e:
        _close(db)
        if "locked" in str(e) or "busy" in str(e):
            raise UsageError(
                f"{path}: the usage database is locked by another process (another localserve "
                f"on the same state directory, or a tool holding it open) for over "
                f"{LOCK_TIMEOUT_S:g} s"
            ) from None
        raise UsageError(f"{path}: cannot use the usage database: {e}") from None
    except sqlite3.DatabaseError as e:
        _close(db)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UsageError(
            f"{path}: not a usable SQLite database ({first}): move it aside to start a new one "
            f"(the old one may be recoverable with sqlite3's .recover)"
        ) from None
    except BaseException:
        _close(db)
        raise
    return db


def _open_readonly(path: Path) -> sqlite3.Connection:
    """Read-only; if the WAL's shared memory cannot be made (no write access to the directory
    and no server running), as an immutable file."""
    for flags in ("mode=ro", "mode=ro&immutable=1"):
        db = sqlite3.connect(
            f"file:{path}?{flags}", uri=True, timeout=LOCK_TIMEOUT_S, check_same_thread=False
        )
        try:
            db.execute("PRAGMA user_version").fetchone()
            return db
        except sqlite3.OperationalError:
            db.close()
            if "immutable" in flags:
                raise
    raise AssertionError("unreachable")


def _check(db: sqlite3.Connection, path: Path, readonly: bool) -> None:
    if not readonly:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = FULL")  # a commit survives a crash, even power loss
    ok = db.execute("PRAGMA quick_check").fetchone()[0]
    if ok != "ok":
        raise sqlite3.DatabaseError(ok)
    version = db.execute("PRAGMA user_version").fetchone()[0]
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if version > SCHEMA_VERSION:
        raise UsageError(
            f"{path}: written by a newer localserve (schema {version}, this one knows "
            f"{SCHEMA_VERSION}): upgrade, or set [server] state_dir elsewhere"
        )
    if version == 0 and tables:
        raise UsageError(f"{path}: some other program's database: move it or set state_dir")
    if readonly and version < SCHEMA_VERSION:
        raise UsageError(f"{path}: an older schema ({version}): start the server once")
    if not readonly:
        _migrate(db, version)
        # can it write? Another process may hold the lock, the file may be read-only
        db.execute("BEGIN IMMEDIATE")
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("ROLLBACK")
    columns = {row[1] for row in db.execute("PRAGMA table_info(requests)")}
    missing = {*COLUMN_NAMES, "day"}
    if missing - columns:
        raise UsageError(f"{path}: its `requests` table is not localserve's: move it aside")


def _close(db: sqlite3.Connection | None) -> None:
    if db is not None:
        db.close()


def _migrate(db: sqlite3.Connection, version: int) -> None:
    for number, statements in enumerate(MIGRATIONS[version:], start=version + 1):
        with db:  # one transaction per step: a crash mid-migration leaves the old version
            db.execute("BEGIN IMMEDIATE")
            for statement in statements:
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {number}")
        log.info("usage database: schema %d", number)


def totals_since(db: sqlite3.Connection, since: float) -> dict[str, UserUsage]:
    rows = db.execute(
        "SELECT user, COUNT(*), SUM(prompt_tokens), SUM(cached_tokens), SUM(completion_tokens) "
        "FROM requests WHERE finished >= ? GROUP BY user",
        (since,),
    )
    return {user: UserUsage(user, *counts) for user, *counts in rows}


def rows_of(db: sqlite3.Connection, where: str = "1", args: Iterable = ()) -> list[Row]:
    """Rows as Row objects (for tests and tools)."""
    cursor = db.execute(f"SELECT {COLUMNS} FROM requests WHERE {where} ORDER BY id", tuple(args))
    return [Row(*values) for values in cursor]
