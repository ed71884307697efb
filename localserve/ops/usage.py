"""The usage record: one row per finished request, committed by one writer thread.

Every request that ends (done, cancelled, error; websocket or HTTP) becomes a row of
`usage.sqlite3` in the state directory (its schema: ops/usage_database.py). One writer thread
owns the writes: the event loop hands it the row and the `done` frame waits for the commit (a
few milliseconds with WAL), so a client whose `done` says `recorded: true` can count on the
row, whatever happens to the process next. A clean shutdown drains the queue; a crash loses at
most rows whose `done` did not say so.

When the record cannot be written (disk full, I/O errors, the file deleted or replaced under
the server) nothing is dropped quietly: `problem` says why (for /healthz and the monitor), one
log line marks each change of state, the rows wait in memory (up to MAX_UNWRITTEN_ROWS) and
the writer tries again every RETRY_S, opening a new database where the old one was deleted.

Each row counts against its user's daily quota as it is handed over (ops/quotas.py: today's
counts, loaded from the database at start-up, and the holds of requests in flight). The
access log (ops/access_log.py) gets a line per row from the same thread, so a slow disk never
stalls the event loop. What `localserve usage` prints from the record is
localserve/ops/usage_report.py's.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import logging.handlers
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from localserve.config import ServerConfig
from localserve.ops.access_log import AccessLog
from localserve.ops.quotas import Quotas, local_day_start
from localserve.ops.state_dir import file_identity
from localserve.ops.usage_database import (
    DATABASE,
    INSERT,
    Row,
    UsageError,
    connect,
    totals_since,
)

log = logging.getLogger("localserve.ops.usage")

# While the record cannot be written (disk full, I/O errors, the file deleted), rows wait in
# memory, up to this many (a few MiB); beyond, the oldest are dropped, and the log says so.
MAX_UNWRITTEN_ROWS = 10_000
RETRY_S = 1.0  # how often the writer tries again while the record is broken
CHECK_S = 2.0  # how often an idle writer checks that the file at the path is still its own
CLOSE_TIMEOUT_S = 5.0  # how long a shutdown waits for rows that cannot be written
JOURNALS = ("-wal", "-shm")  # the files SQLite keeps beside the database in WAL mode

# --- where things live -----------------------------------------------------------------------


def state_dir(config: ServerConfig) -> Path:
    """[server] state_dir, else $LOCALSERVE_STATE_DIR, $XDG_STATE_HOME/localserve, or
    ~/.local/state/localserve."""
    if config.state_dir:
        return Path(config.state_dir).expanduser()
    if os.environ.get("LOCALSERVE_STATE_DIR"):
        return Path(os.environ["LOCALSERVE_STATE_DIR"]).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "localserve"


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
        self._access: AccessLog | None = None
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

    def open_access_log(self, host: str) -> Path | None:
        """Start the access log as [server] access_log says (ops/access_log.py); its path."""
        self._access = AccessLog.open(self.config, self.dir, host)
        return self._access.path if self._access is not None else None

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
        if self._access is not None:  # one line per request, whatever the database does
            self._access.write(dataclasses.asdict(item[0]))
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
            found = file_identity(self.path)
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
                old = self._files[suffix]
                if old is not None and file_identity(journal) == old:
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
            self._access.close()
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
    return {suffix: file_identity(Path(f"{path}{suffix}")) for suffix in ("", *JOURNALS)}


def _is_storage_error(e: Exception) -> bool:
    """The database or its disk failed (full, I/O, locked, corrupt), not the row."""
    return isinstance(e, sqlite3.OperationalError | OSError) or type(e) is sqlite3.DatabaseError


def _reason(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _close_quietly(db: sqlite3.Connection | None) -> None:
    with contextlib.suppress(Exception):  # a database on a dead disk may fail even that
        if db is not None:
            db.close()
