"""The Responses API's stored responses, per person: SQLite in the state dir.

A response created with `store` (OpenAI's default) is kept here so that a later request of the
same person may continue it (`previous_response_id`), read it (`GET /v1/responses/{id}`) or
delete it. A row keeps what the front-end gives it, opaque to the store: the response as it was
sent (`body`), the chat turns it adds to its chain (`turns`: its input and its output as
messages) and its input items (`input`), with its id, model, the response it continues and its
`depth` (1 for a response that continues none, one more than its previous one's otherwise).

Rows are keyed by (user, id): every read, walk and delete names the person, so another person's
id is not found, exactly as an id that never existed. A chain is read in one query that follows
`previous` from the named row within that person's rows only, at most `max_depth` rows: the
named row's depth and its chain's bytes (kept per row: its turns' and its previous one's) say
first whether the chain is within the bounds (no walk for a chain too deep or too large), and a
chain with a row gone (dropped or deleted) is said to be broken.

Each person's share is bounded: at most `max_count` responses and `max_bytes` bytes of them;
a response stored past either bound drops that person's oldest first (OpenAI keeps 30 days;
a chain whose oldest response was dropped is then broken). One response alone over
`max_bytes // 16` is not stored. The whole store is bounded too, `max_total_count` responses
and `max_total_bytes` (an open server has as many persons as names anyone invents, and the
disk is the usage record's too): past either, everyone's oldest are dropped first. Its totals
are counted once at start and kept with each commit, so no write reads the whole table.

One thread owns the database (`responses.sqlite3`, beside the usage record): the event loop hands
it every read and write, so a slow disk never stalls the server; a response is stored (committed)
before its reply says it is done, so a follow-up sent at once finds it.

Tested in tests/unit/ops/test_responses_store.py and tests/e2e/test_responses_api.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import sqlite3
import time
from pathlib import Path
from typing import NamedTuple

import msgspec

from localserve.config import ConfigError, ServerConfig
from localserve.ops.sqlite_files import open_store
from localserve.ops.usage import state_dir

log = logging.getLogger("localserve.ops.responses_store")

DATABASE = "responses.sqlite3"
SCHEMA = """CREATE TABLE IF NOT EXISTS responses (
    user TEXT NOT NULL,
    id TEXT NOT NULL,
    created INTEGER NOT NULL,      -- s since the epoch
    model TEXT NOT NULL,
    previous TEXT,                 -- the response it continues (NULL: none)
    depth INTEGER NOT NULL,        -- 1 + the previous one's depth (1: it continues none)
    chain_bytes INTEGER NOT NULL,  -- its turns' bytes + the previous one's chain_bytes
    bytes INTEGER NOT NULL,        -- of body, turns and input: what the bound counts
    body BLOB NOT NULL,            -- the response object as sent (JSON)
    turns BLOB NOT NULL,           -- the chat turns it adds to its chain (the front-end's JSON)
    input BLOB NOT NULL,           -- its input items (JSON)
    UNIQUE (user, id)
)"""
SCHEMA_VERSION = 1
CHAIN = """WITH RECURSIVE chain(id, previous, turns, n) AS (
    SELECT id, previous, turns, 1 FROM responses WHERE user = ?1 AND id = ?2
    UNION ALL
    SELECT r.id, r.previous, r.turns, chain.n + 1 FROM responses r JOIN chain
        ON r.user = ?1 AND r.id = chain.previous WHERE chain.n < ?3
) SELECT id, previous, turns FROM chain"""


class StoredResponse(msgspec.Struct, kw_only=True):
    """One response as the store keeps it; body, turns and input are the front-end's JSON."""

    id: str
    model: str
    previous: str | None
    depth: int
    chain_bytes: int  # of its turns and its chain's: what a follow-up's prompt is made of
    body: bytes
    turns: bytes
    input: bytes
    created: int = 0

    @property
    def size(self) -> int:
        return len(self.body) + len(self.turns) + len(self.input)


class Chain(NamedTuple):
    turns: list[bytes]  # each response's turns, oldest first
    depth: int  # how many responses it is (the last one's depth)
    bytes: int  # of all the turns


class ResponseStoreError(Exception):
    """A read or write the store could not do: its message says why."""


class ChainTooDeep(ResponseStoreError):
    """A chain past the bound: `depth` is how deep the named response already is."""

    def __init__(self, depth: int, max_depth: int) -> None:
        super().__init__(f"a chain of {depth} responses; at most {max_depth} are followed")
        self.depth, self.max_depth = depth, max_depth


class ChainTooLarge(ResponseStoreError):
    """A chain whose turns are past the bound in bytes."""

    def __init__(self, size: int, max_bytes: int) -> None:
        super().__init__(f"a chain of {size} bytes; at most {max_bytes} are followed")
        self.size, self.max_bytes = size, max_bytes


class ChainBroken(ResponseStoreError):
    """A response of the chain is no longer stored (dropped by the bounds, or deleted)."""


class ResponseStoreUnusable(ConfigError):
    """The database cannot be used: said at start-up, before anyone connects."""


class ResponseStore:
    """The people's stored responses: put, get, chain, delete, each on the store's thread."""

    def __init__(
        self,
        path: Path,
        max_count: int,
        max_bytes: int,
        max_total_count: int = 20_000,
        max_total_bytes: int = 1 << 30,
    ) -> None:
        self.path = path
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.max_total_count, self.max_total_bytes = max_total_count, max_total_bytes
        self._db = open_store(
            path, SCHEMA, SCHEMA_VERSION, "the response store", ResponseStoreUnusable
        )
        # everyone's responses and bytes, as committed (the bytes column is read, not the blobs)
        self.total_count, self.total_bytes = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM responses"
        ).fetchone()
        self._thread = concurrent.futures.ThreadPoolExecutor(1, "localserve-responses")
        self._closed = False

    @classmethod
    def open(cls, config: ServerConfig) -> ResponseStore:
        path = state_dir(config) / DATABASE
        return cls(
            path,
            config.max_responses_per_user,
            config.max_response_bytes_per_user,
            config.max_responses,
            config.max_response_bytes,
        )

    @property
    def max_item_bytes(self) -> int:
        """One response larger than this is not stored (a person's share holds many)."""
        return self.max_bytes // 16

    async def _run(self, fn, *args):
        if self._closed:
            raise ResponseStoreError("the server is shutting down")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, functools.partial(fn, *args))
        except sqlite3.Error as e:
            log.error("responses: %s: %s", self.path, e)
            raise ResponseStoreError(f"the server could not use its response store ({e})") from None

    # --- what the front-end asks ---

    async def put(self, user: str, response: StoredResponse) -> bool:
        """Store it, the person's oldest dropped past the bounds; False when it alone is over
        max_item_bytes (not stored)."""
        if response.size > self.max_item_bytes:
            return False
        await self._run(self._put, user, response)
        return True

    async def get(self, user: str, id: str) -> StoredResponse | None:
        """The person's response `id`; None when they have none of that id (another's too)."""
        return await self._run(self._get, user, id)

    async def chain(self, user: str, id: str, max_depth: int, max_bytes: int) -> Chain:
        """The chain that ends with the person's response `id`: its turns, oldest first, its
        depth and size. KeyError: they have no response `id`; ChainTooDeep: one continuing it
        would be past `max_depth`; ChainTooLarge: its turns are over `max_bytes`; ChainBroken:
        one of its responses is gone. The bounds are decided from the row alone."""
        return await self._run(self._chain, user, id, max_depth, max_bytes)

    async def delete(self, user: str, id: str) -> bool:
        return await self._run(self._delete, user, id)

    def close(self) -> None:
        self._closed = True
        self._thread.shutdown(wait=True)  # a write in progress commits first
        self._db.close()

    # --- on the store's thread ---

    def _put(self, user: str, r: StoredResponse) -> None:
        created = r.created or int(time.time())
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            old = self._db.execute(  # one of the same id is replaced
                "SELECT bytes FROM responses WHERE user = ? AND id = ?", (user, r.id)
            ).fetchone()
            self._db.execute(
                "INSERT OR REPLACE INTO responses (user, id, created, model, previous, depth, "
                "chain_bytes, bytes, body, turns, input) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (user, r.id, created, r.model, r.previous, r.depth, r.chain_bytes, r.size, r.body,
                 r.turns, r.input),
            )  # fmt: skip
            count = self.total_count + (old is None)
            size = self.total_bytes + r.size - (old[0] if old else 0)
            count, size = self._drop_oldest(user, count, size)
        self.total_count, self.total_bytes = count, size  # once committed

    def _drop_oldest(self, user: str, total_count: int, total_bytes: int) -> tuple[int, int]:
        """The person's oldest responses dropped until their bounds hold, then everyone's
        oldest until the store's hold; the store's totals after."""
        count, size = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM responses WHERE user = ?", (user,)
        ).fetchone()
        doomed = []
        if count > self.max_count or size > self.max_bytes:
            rows = self._db.execute(
                "SELECT rowid, bytes FROM responses WHERE user = ? ORDER BY rowid", (user,)
            )
            for rowid, nbytes in rows:
                if count <= self.max_count and size <= self.max_bytes:
                    break
                doomed.append((rowid,))
                count, size, total_count, total_bytes = (
                    count - 1, size - nbytes, total_count - 1, total_bytes - nbytes
                )  # fmt: skip
            self._db.executemany("DELETE FROM responses WHERE rowid = ?", doomed)
        while total_count > self.max_total_count or total_bytes > self.max_total_bytes:
            oldest = self._db.execute(
                "SELECT rowid, bytes FROM responses ORDER BY rowid LIMIT 64"
            ).fetchall()
            if not oldest:  # nothing left (totals that drifted): nothing more to drop
                return 0, 0
            doomed = []
            for rowid, nbytes in oldest:
                if total_count <= self.max_total_count and total_bytes <= self.max_total_bytes:
                    break
                doomed.append((rowid,))
                total_count, total_bytes = total_count - 1, total_bytes - nbytes
            self._db.executemany("DELETE FROM responses WHERE rowid = ?", doomed)
        return total_count, total_bytes

    def _get(self, user: str, id: str) -> StoredResponse | None:
        row = self._db.execute(
            "SELECT id, model, previous, depth, chain_bytes, body, turns, input, created "
            "FROM responses WHERE user = ? AND id = ?",
            (user, id),
        ).fetchone()
        if row is None:
            return None
        id, model, previous, depth, chain_bytes, body, turns, input, created = row
        return StoredResponse(id=id, model=model, previous=previous, depth=depth, body=body,
                              chain_bytes=chain_bytes, turns=turns, input=input,
                              created=created)  # fmt: skip

    def _chain(self, user: str, id: str, max_depth: int, max_bytes: int) -> Chain:
        found = self._db.execute(
            "SELECT depth, chain_bytes FROM responses WHERE user = ? AND id = ?", (user, id)
        ).fetchone()
        if found is None:
            raise KeyError(id)
        depth, size = found
        if depth >= max_depth:  # the one continuing it would be past the bound: no walk
            raise ChainTooDeep(depth, max_depth)
        if size > max_bytes:
            raise ChainTooLarge(size, max_bytes)
        rows = self._db.execute(CHAIN, (user, id, max_depth)).fetchall()
        last_previous = rows[-1][1]
        if last_previous is not None:  # its oldest continues one that is gone
            raise ChainBroken(
                f"{last_previous[:64]!r}, a response this one continues, is no longer stored"
            )
        return Chain([turns for _, _, turns in reversed(rows)], depth, size)

    def _delete(self, user: str, id: str) -> bool:
        with self._db:
            gone = self._db.execute(
                "DELETE FROM responses WHERE user = ? AND id = ? RETURNING bytes", (user, id)
            ).fetchall()
        if gone:
            self.total_count, self.total_bytes = self.total_count - 1, self.total_bytes - gone[0][0]
        return bool(gone)
