"""Who used how much: one row per finished request in SQLite, and the access log.

Every request that ends (done, cancelled, error; websocket or HTTP) becomes a row of
`usage.sqlite3` in the state directory. One writer thread owns the writes: the event loop hands
it the row and the `done` frame waits for the commit (a few milliseconds with WAL), so a client
whose `done` says `recorded: true` can count on the row, whatever happens to the process next.
A clean shutdown drains the queue; a crash loses at most rows whose `done` did not say so.

When the record cannot be written (disk full, I/O errors, the file deleted or replaced under
the server) nothing is dropped quietly: `problem` says why (for /healthz and the monitor), one
log line marks each change of state, the rows wait in memory (up to MAX_UNWRITTEN_ROWS) and
the writer tries again every RETRY_S, opening a new database where the old one was deleted.

Each row counts against its user's daily quota as it is handed over (ops/quotas.py: today's
counts, loaded from the database at start-up, and the holds of requests in flight).

The access log (one line per finished request, plain or JSON, rotated by size) is written by
the same thread, so a slow disk never stalls the event loop. What `localserve usage` prints
from the record is localserve/ops/usage_report.py's.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import json
import logging
import logging.handlers
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from localserve.config import ConfigError, ServerConfig
from localserve.ops.quotas import Quotas, local_day_start
from localserve.protocol.frames import UserUsage

log = logging.getLogger("localserve.ops.usage")

DATABASE = "usage.sqlite3"
ACCESS_LOG = "access.log"
LOCK_TIMEOUT_S = 5.0  # waiting for another writer (a second server on the same state dir)
# While the record cannot be written (disk full, I/O errors, the file deleted), rows wait in
# memory, up to this many (a few MiB); beyond, the oldest are dropped, and the log says so.
MAX_UNWRITTEN_ROWS = 10_000
RETRY_S = 1.0  # how often the writer tries again while the record is broken
CHECK_S = 2.0  # how often an idle writer checks that the file at the path is still its own
CLOSE_TIMEOUT_S = 5.0  # how long a shutdown waits for rows that cannot be written
JOURNALS = ("-wal", "-shm")  # the files SQLite keeps beside the database in WAL mode

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


# --- where things live ---------------------------------------------------------------------


def state_dir(config: ServerConfig) -> Path:
    """[server] state_dir, else $LOCALSERVE_STATE_DIR, $XDG_STATE_HOME/localserve, or
    ~/.local/state/localserve."""
    if config.state_dir:
        return Path(config.state_dir).expanduser()
    if os.environ.get("LOCALSERVE_STATE_DIR"):
        return Path(os.environ["LOCALSERVE_STATE_DIR"]).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "localserve"


# --- the database --------------------------------------------------------------------------


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection to the usage database, checked: a corrupt, foreign, newer, read-only or
    locked file is a UsageError naming it and saying what to do."""
    if path.exists() and not path.is_file():
        raise UsageError(f"{path}: not a file: move it aside or set [server] state_dir")
    if readonly and not path.is_file():
        raise UsageError(f"{path}: no usage database here (has the server recorded any?)")
    if not readonly:
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise UsageError(f"{path.parent}: cannot create the state directory: {e}") from None
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


# --- the server's side ---------------------------------------------------------------------


class Usage:
    """The server's record keeper: the rows, the access log, and the quotas its rows count
    against (`quotas`)."""

    def __init__(self, config: ServerConfig, model: str, clock: Callable[[], float] = time.time):
        self.config = config
        self.model = model
        self.clock = clock
        self.dir = state_dir(config)
        self.path = self.dir / DATABASE
        self.db: sqlite3.Connection | None = connect(self.path)
        self._files = _identities(self.path)  # deleted or replaced under us: noticed
        # today's counts and the quotas (on the event loop only)
        self.quotas = Quotas(config, clock, totals_since(self.db, local_day_start(clock())))
        self._access: logging.Logger | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.version = 0  # advances with every row: the stats frame's cache key
        self.problem = ""  # why the record cannot be written now; "" while it can
        self.num_lost = 0  # rows that will never be written (over the bound, or at close)
        self._unwritten: collections.deque[tuple[Row, Callable[[bool], None]]] = (
            collections.deque()
        )  # in order; their `then`s run once they are committed
        self._num_lost_now = 0  # since the record broke
        self._next_try = 0.0  # while it is broken: when the writer tries again
        # a daemon: a writer stuck on a dead disk must not keep the process from exiting
        self._writer = threading.Thread(
            target=self._write_loop, name="localserve-usage", daemon=True
        )
        self._writer.start()

    # --- access log ---

    def open_access_log(self, host: str) -> Path | None:
        """Start the access log as [server] access_log says ("auto": only off loopback)."""
        from localserve.ops.auth import is_loopback

        setting = self.config.access_log
        if setting == "off" or (setting == "auto" and is_loopback(host)):
            return None
        path = self.dir / ACCESS_LOG if setting == "auto" else Path(setting).expanduser()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.handlers.RotatingFileHandler(
                path,
                maxBytes=self.config.access_log_max_bytes,
                backupCount=self.config.access_log_backups,
                encoding="utf-8",
            )
            os.chmod(path, 0o600)
        except OSError as e:
            raise UsageError(f"{path}: cannot open the access log: {e}") from None
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger = logging.getLogger(f"localserve.access.{id(self)}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        self._access = logger
        return path

    def _access_line(self, row: Row) -> str:
        when = datetime.datetime.fromtimestamp(row.finished).astimezone()
        stamp = when.isoformat(timespec="milliseconds")
        if self.config.access_log_format == "json":
            return json.dumps({"time": stamp} | dataclasses.asdict(row), ensure_ascii=False)
        timings = " ".join(f"{k}={_ms(getattr(row, k))}" for k in ("queue_ms", "ttft_ms", "e2e_ms"))
        user, request = (json.dumps(x, ensure_ascii=False) for x in (row.user, row.request_id))
        return (  # the user and the id are the client's words: quoted, a line stays a line
            f"{stamp} {user} {request} {row.api} "
            f"{row.model} {row.finish_reason} prompt={row.prompt_tokens} "
            f"cached={row.cached_tokens} completion={row.completion_tokens} {timings}"
        )

    # --- rows (the loop hands them over; the writer thread owns everything below) ---

    def record(self, row: Row, then: Callable[[bool], None]) -> None:
        """Count the row now; `then(True)` runs (on the writer thread) once it is committed,
        `then(False)` if it never will be (a row SQLite refuses, or lost: see _lose)."""
        self.quotas.count(row.user, row.prompt_tokens, row.cached_tokens, row.completion_tokens)
        self.version += 1
        self._queue.put((row, then))

    @property
    def num_unwritten(self) -> int:
        """Rows kept in memory until the record can be written."""
        return len(self._unwritten)

    def _write_loop(self) -> None:
        while not self._take():
            if not self.problem or time.monotonic() >= self._next_try:
                self._try_write()
        self._finish()

    def _try_write(self) -> None:
        try:
            self._write()
        except Exception as e:  # a bug must not end the thread: the rows are kept, tried again
            problem = f"the usage writer failed: {_reason(e)}"
            if problem != self.problem:
                log.exception("usage record: writing failed")
            self._broken(problem, is_said=True)

    def _take(self) -> bool:
        """Move what is queued to the unwritten rows, waiting a while for it; True at the stop."""
        wait = RETRY_S if self.problem else CHECK_S  # idle, the file is still checked
        try:
            item = self._queue.get(timeout=wait)
        except queue.Empty:
            return False
        while item is not None:
            self._keep(item)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return False
        return True  # the stop sentinel: everything before it is kept

    def _keep(self, item: tuple[Row, Callable[[bool], None]]) -> None:
        self._access_log(item[0])  # one line per request, whatever the database does
        self._unwritten.append(item)
        if len(self._unwritten) > MAX_UNWRITTEN_ROWS:
            self._lose(*self._unwritten.popleft())

    def _lose(self, row: Row, then: Callable[[bool], None]) -> None:
        if not self._num_lost_now:
            log.error(
                "usage database %s: over %d rows unwritten: the oldest are dropped, lost for "
                "good (today's quota counts keep them until a restart)",
                self.path,
                MAX_UNWRITTEN_ROWS,
            )
        self._num_lost_now += 1
        self.num_lost += 1
        _tell_recorded(then, row, False)

    def _write(self) -> None:
        """Check the file, then commit the unwritten rows in one transaction and let their
        `done`s go; if that fails, keep them all for the next try."""
        self._check_file()
        if self.db is None or not self._unwritten:
            return
        entries = list(self._unwritten)
        try:
            recorded = self._insert([row for row, _ in entries])
        except Exception as e:  # disk full, I/O error, locked: all kept, tried again
            return self._broken(f"cannot write {self.path}: {_reason(e)}")
        self._unwritten.clear()
        self._fixed(len(entries))
        for (row, then), ok in zip(entries, recorded, strict=True):
            _tell_recorded(then, row, ok)

    def _insert(self, rows: list[Row]) -> list[bool]:
        """Commit the rows; a row SQLite will never take (a bad value) is left out (False) and
        logged, the others go in. Raises when the transaction as a whole fails."""
        recorded = []
        with self.db:
            for row in rows:
                try:
                    self.db.execute(INSERT, row.values())
                    recorded.append(True)
                except Exception as e:
                    if _is_storage_error(e):
                        raise
                    log.exception("usage database %s: %s not recorded", self.path, row.request_id)
                    recorded.append(False)
        return recorded

    def _check_file(self) -> None:
        """A database deleted or replaced under the server is said, and the one at `path` (a
        new one if none is there) opened for the rows from now on."""
        try:
            found = _identity(self.path)
        except OSError as e:
            return self._broken(f"cannot check {self.path}: {_reason(e)}")
        if self.db is not None and found == self._files[""]:
            return
        if self.db is not None:
            what = "deleted" if found is None else "replaced by another file"
            log.error(
                "usage database %s was %s while serving: the rows recorded until now are not "
                "in the database at that path any more (today's quota counts are kept in "
                "memory, but a restart starts from what the database holds); opening %s",
                self.path,
                what,
                "a new one" if found is None else "the file now there",
            )
            self._broken(f"{self.path} was {what} while serving", is_said=True)
            _close_quietly(self.db)
            self.db = None
            self._remove_journals()
        self._reopen()

    def _remove_journals(self) -> None:
        """The old database's WAL, left at the path, would be read into the file now there
        (SQLite applies it to whatever it finds): remove it, and only if it is the old one."""
        for suffix in JOURNALS:
            journal = Path(f"{self.path}{suffix}")
            with contextlib.suppress(OSError):
                if self._files[suffix] is not None and _identity(journal) == self._files[suffix]:
                    journal.unlink()

    def _reopen(self) -> None:
        try:
            self.db = connect(self.path)
            self._files = _identities(self.path)
        except (UsageError, OSError) as e:
            _close_quietly(self.db)
            self.db = None
            return self._broken(str(e))
        if not self._unwritten:  # else the rows' commit says whether it can be written
            self._fixed(0)

    def _broken(self, problem: str, is_said: bool = False) -> None:
        """The record cannot be written: one ERROR line when that starts (or changes why)."""
        self._next_try = time.monotonic() + RETRY_S
        if problem != self.problem and not is_said:
            log.error(
                "usage record: %s; %d rows kept in memory, tried again every %g s (the `done`s "
                "of their requests say recorded: false; chats under a quota are refused)",
                problem,
                len(self._unwritten),
                RETRY_S,
            )
        self.problem = problem

    def _fixed(self, num_written: int) -> None:
        """Written again: one WARNING line, with what was kept and what was lost."""
        if self.problem:
            lost = f"; {self._num_lost_now} rows were lost" if self._num_lost_now else ""
            log.warning(
                "usage record: %s is written again (%d rows kept in memory written%s)",
                self.path,
                num_written,
                lost,
            )
        self.problem, self._num_lost_now = "", 0

    def _finish(self) -> None:
        """At close: the unwritten rows get CLOSE_TIMEOUT_S; what is left then is lost, and said."""
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        self._next_try = 0.0
        while True:
            if time.monotonic() >= self._next_try:
                self._try_write()
            if not self._unwritten or time.monotonic() >= deadline:
                break
            time.sleep(min(RETRY_S / 4, max(0.0, deadline - time.monotonic())))
        if self._unwritten:
            log.error(
                "usage database %s: %d rows could not be written and are lost (%s); after a "
                "restart today's quota counts lack them",
                self.path,
                len(self._unwritten),
                self.problem,
            )
            self.num_lost += len(self._unwritten)
            while self._unwritten:
                row, then = self._unwritten.popleft()
                _tell_recorded(then, row, False)
        _close_quietly(self.db)

    def _access_log(self, row: Row) -> None:
        if self._access is not None:
            try:
                self._access.info(self._access_line(row))
            except Exception:
                log.exception("access log: %s", row.request_id)

    def close(self) -> int:
        """Write what is queued (for up to CLOSE_TIMEOUT_S if the record is broken), then close;
        a clean shutdown on a working disk loses nothing. Returns how many rows were lost."""
        self._queue.put(None)
        self._writer.join(CLOSE_TIMEOUT_S + 5)
        if self._writer.is_alive():  # stuck in a system call: its rows die with the process
            stuck = self.num_unwritten + self._queue.qsize() - 1
            log.error("usage database %s: the writer is stuck; %d rows are lost", self.path, stuck)
            return self.num_lost + stuck
        if self._access is not None:
            for handler in self._access.handlers:
                handler.close()
        return self.num_lost

    def record_refusal(self, user: str) -> str | None:
        """Why a chat of the user's is refused while the record cannot be written, else None:
        a quota a restart would forget cannot be kept (users without one are served)."""
        if not self.problem or not self.quotas.daily_tokens(user):
            return None
        return (
            f"the usage record cannot be written ({self.problem}), and chats under a daily "
            "quota are refused until it can; try again shortly"
        )


def _tell_recorded(then: Callable[[bool], None], row: Row, recorded: bool) -> None:
    try:
        then(recorded)
    except Exception:
        log.exception("after recording %s", row.request_id)


def _identities(path: Path) -> dict[str, tuple[int, int] | None]:
    """The database's files: its own ("") and its journals'."""
    return {suffix: _identity(Path(f"{path}{suffix}")) for suffix in ("", *JOURNALS)}


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at `path` (device, inode), None when there is none."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


def _is_storage_error(e: Exception) -> bool:
    """The database or its disk failed (full, I/O, locked, corrupt), not the row."""
    return isinstance(e, sqlite3.OperationalError | OSError) or type(e) is sqlite3.DatabaseError


def _reason(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _close_quietly(db: sqlite3.Connection | None) -> None:
    with contextlib.suppress(Exception):  # a database on a dead disk may fail even that
        _close(db)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def rows_of(db: sqlite3.Connection, where: str = "1", args: Iterable = ()) -> list[Row]:
    """Rows as Row objects (for tests and tools)."""
    cursor = db.execute(f"SELECT {COLUMNS} FROM requests WHERE {where} ORDER BY id", tuple(args))
    return [Row(*values) for values in cursor]
