"""The people trusted front-ends named, kept: SQLite in the state dir, so that a name stays its
person's across restarts and crashes.

A trusted front-end (serve/trusted_proxies.py) names a person by its own id for them (Open WebUI's
X-OpenWebUI-User-Id) and a name; the first name an id comes with is bound to that id, and the
id's requests are the user "<frontend>/<name>" from then on (their usage rows, quota and cached
prefixes). Kept in memory only, the bindings went with each restart, and the first id to send
a name after one took it. Here each new binding is committed (WAL, synchronous = FULL) before
the person's request goes on: no reply goes to a person this file does not know, even after a
SIGKILL or a power cut. A row is a name (the identity's display) and the id it is bound to, or
none for a person a front-end names without ids (`X-Localserve-User` alone).

One thread owns the database (`people.sqlite3`, beside the usage record): the bindings are read
once at start and kept by the event loop (trusted_proxies.People), which hands this thread each new
one; so people already known are served without it, also while the file cannot be written. The
rows are bounded per front-end by `[server] max_people_per_frontend`: trusted_proxies.People refuses
a new person past it before anything is written. A file that is not such a store stops the
server at start, naming it.

Before each commit the store checks that its file is still the one it opened (device and
inode, as the usage record does): a file deleted or replaced under the server would take new
bindings that the next start does not find, and every person's name would be free for the
taking again. New people are then refused (503, Retry-After; /healthz says why) until the
server restarts on a store it can keep; known people go on. For the same reason a store that
names nobody, where the usage record has requests of a trusted front-end's people, was lost:
the server does not start on it (`[server] forget_lost_people = true` starts anyway).

Tested in tests/unit/ops/test_people.py and tests/e2e/test_people_store.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import sqlite3
import time
from pathlib import Path
from typing import NamedTuple

from localserve.config import ConfigError, ServerConfig
from localserve.ops.sqlite_files import open_store
from localserve.ops.state_dir import file_identity
from localserve.ops.usage import state_dir
from localserve.ops.usage_database import DATABASE as USAGE_DATABASE

log = logging.getLogger("localserve.ops.people")

DATABASE = "people.sqlite3"
SCHEMA = """CREATE TABLE IF NOT EXISTS people (
    frontend TEXT NOT NULL,    -- the trusted front-end: its user in the users file
    name TEXT NOT NULL,        -- the person's name, normalized: the user "<frontend>/<name>"
    account TEXT,              -- the front-end's id for them; NULL: named without one (yet)
    bound INTEGER NOT NULL,    -- ms since the epoch, when the name was first given
    PRIMARY KEY (frontend, name),
    UNIQUE (frontend, account)
) WITHOUT ROWID"""
SCHEMA_VERSION = 1


class Binding(NamedTuple):
    """A person of a front-end: their name here and the front-end's id for them (None: none)."""

    frontend: str
    name: str
    account: str | None


class BindingFailed(Exception):
    """A binding the store could not commit: its message says why."""


class PeopleUnusable(ConfigError):
    """The database cannot be used: said at start-up, before anyone connects."""


class PeopleStore:
    """The bindings of the people trusted front-ends named: read at start, each new one
    committed on the store's thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._thread = concurrent.futures.ThreadPoolExecutor(1, "localserve-people")
        try:
            self._db = self._thread.submit(_connect, path).result()
            self._file = file_identity(path)  # the file opened: checked before each commit
        except BaseException:
            self._thread.shutdown()
            raise
        self._closed = False
        self.problem = ""  # why the last binding could not be written ("" since one could)

    @classmethod
    def open(cls, config: ServerConfig) -> PeopleStore:
        """The state directory's store; PeopleUnusable for one that cannot be used, or that
        was lost (it names nobody, the usage record names the front-ends' people)."""
        store = cls(state_dir(config) / DATABASE)
        try:
            if not config.forget_lost_people and not store.bindings():
                _check_not_lost(store.path, state_dir(config) / USAGE_DATABASE, config)
        except BaseException:
            store.close()
            raise
        return store

    def bindings(self) -> list[Binding]:
        """Every binding kept, oldest first (read once, at start)."""
        return self._thread.submit(self._read).result()

    async def bind(self, binding: Binding) -> None:
        """Commit `binding`: a new name (with its id, or none), or a name's first id. Returns
        once it is on disk; BindingFailed when it cannot be written."""
        if self._closed:
            raise BindingFailed("the server is shutting down")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._thread, functools.partial(self._bind, binding))
        except (sqlite3.Error, BindingFailed) as e:  # a full disk, a file made read-only, ...
            if not self.problem:  # said once, not once per refused person
                log.error("people: %s: %s; new people are refused, known ones go on", self.path, e)
            self.problem = str(e)
            raise BindingFailed(str(e)) from None
        if self.problem:
            log.warning("people: %s: written again", self.path)
            self.problem = ""

    def close(self) -> None:
        self._closed = True
        self._thread.shutdown(wait=True)  # a binding in progress commits first
        self._db.close()

    # --- on the store's thread ---

    def _read(self) -> list[Binding]:
        rows = self._db.execute("SELECT frontend, name, account FROM people ORDER BY bound, name")
        return [Binding(*row) for row in rows]

    def _bind(self, b: Binding) -> None:
        try:
            found = file_identity(self.path)
        except OSError as e:
            raise BindingFailed(f"cannot check {self.path}: {e.strerror or e}") from None
        if found != self._file:  # committed there, it would be gone at the next start
            what = "deleted" if found is None else "replaced by another file"
            raise BindingFailed(f"{self.path} was {what} while serving; restart the server")
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(  # a name known without an id takes its first one
                "INSERT INTO people VALUES (?, ?, ?, ?) ON CONFLICT (frontend, name) "
                "DO UPDATE SET account = excluded.account WHERE people.account IS NULL",
                (b.frontend, b.name, b.account, int(time.time() * 1000)),
            )
            (account,) = self._db.execute(
                "SELECT account FROM people WHERE frontend = ? AND name = ?", (b.frontend, b.name)
            ).fetchone()
            if account != b.account:  # only this server writes it: another one shares the dir?
                raise BindingFailed(f"{b.name!r} of {b.frontend} is another id's in {self.path}")


def _check_not_lost(path: Path, usage: Path, config: ServerConfig) -> None:
    """An empty store at `path` while the usage record has requests of a trusted front-end's
    people: PeopleUnusable, in one line. (A usage record that cannot be read says so itself.)"""
    if not usage.exists():
        return
    try:
        with contextlib.closing(sqlite3.connect(f"file:{usage}?mode=ro", uri=True)) as db:
            for frontend in config.trusted_frontends:
                # "<frontend>/..." by range: '0' follows '/'
                (n,) = db.execute(
                    "SELECT count(DISTINCT user) FROM requests WHERE user >= ? AND user < ?",
                    (f"{frontend}/", f"{frontend}0"),
                ).fetchone()
                if n:
                    raise PeopleUnusable(
                        f"{path} names nobody, but {usage} has requests of {n} "
                        f"{'person' if n == 1 else 'people'} of {frontend}: the store of "
                        "people was lost, and their names would be free for whoever sends "
                        "them first; restore it, or set [server] "
                        "forget_lost_people = true to start with every name new again"
                    )
    except sqlite3.Error:
        return


def _connect(path: Path) -> sqlite3.Connection:
    """The database, created if need be; a file that is not one is said with what to do."""
    return open_store(
        path,
        SCHEMA,
        SCHEMA_VERSION,
        "the store of people",
        PeopleUnusable,
        " (the people named so far are then new again)",
    )
