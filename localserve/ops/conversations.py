"""Each person's conversations from the chat page, kept on the server: SQLite in the state dir.

On a server with users the page keeps a person's conversations here rather than in the browser,
so another browser or a phone signed in as the same person shows the same list (docs/protocol.md,
"Conversations on the server"). A conversation is stored whole, as the page last saved it: its
title, when it was started, and its messages (role, text, and what the page shows under a reply).
Rows are keyed by (user, id): a person reads, renames and deletes only their own; the name comes
from the connection's hello, which the token checked.

One thread owns the database (`conversations.sqlite3`, beside the usage record): the event loop
hands it every read and write, so a slow disk never stalls the server, and a save is answered only
after its commit (WAL, synchronous = FULL): a conversation the page was told is saved survives a
SIGKILL or a power cut.

Each person's share is bounded: at most `max_conversations_per_user` conversations and
`max_conversation_bytes_per_user` bytes of them. A save past either bound is refused with words
that say so and what to do (delete old ones); nothing is deleted to make room, and the page keeps
the conversation it could not save until then. A conversation is also bounded by the frame it
travels in ([server] max_frame_bytes).

Tested in tests/e2e/test_conversation_store.py (and the page's side in test_chat_page.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import sqlite3
import time
from pathlib import Path

import msgspec

from localserve.config import ConfigError, ServerConfig
from localserve.ops.sqlite_files import open_store
from localserve.ops.usage import state_dir
from localserve.protocol.frames import ConversationSummary, SavedConversation, StoredMessage

log = logging.getLogger("localserve.ops.conversations")

DATABASE = "conversations.sqlite3"
SCHEMA = """CREATE TABLE IF NOT EXISTS conversations (
    user TEXT NOT NULL,
    id TEXT NOT NULL,
    title TEXT NOT NULL,
    created INTEGER NOT NULL,      -- ms since the epoch, the page's clock
    updated INTEGER NOT NULL,      -- ms since the epoch, the server's clock at the last save
    revision INTEGER NOT NULL,     -- 1 at the first save, one more at each
    bytes INTEGER NOT NULL,        -- of title and messages, as stored: what the bound counts
    messages BLOB NOT NULL,        -- JSON: a list of StoredMessage
    model TEXT,                    -- the model it talks to (NULL: the server's default)
    PRIMARY KEY (user, id)
) WITHOUT ROWID"""
SCHEMA_VERSION = 2  # 2: the model column (a version 1 file gets it when opened)
SUMMARY = "SELECT id, title, created, updated, revision, bytes FROM conversations"

_encode_messages = msgspec.json.Encoder().encode
_decode_messages = msgspec.json.Decoder(list[StoredMessage]).decode


class StoreError(Exception):
    """A save or read the store could not do: its message says why, for the person."""


class StoreFull(StoreError):
    """A save past the person's bound."""


class Conflict(StoreError):
    """A save of a copy older than the stored conversation (another device saved meanwhile)."""


class StoreUnusable(ConfigError):
    """The database cannot be used: said at start-up, before anyone connects."""


class ConversationStore:
    """The people's conversations: list, get, save, rename, delete, each on the store's thread."""

    def __init__(self, path: Path, max_count: int, max_bytes: int) -> None:
        self.path = path
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._db = _connect(path)
        self._thread = concurrent.futures.ThreadPoolExecutor(1, "localserve-conversations")
        self._closed = False

    @classmethod
    def open(cls, config: ServerConfig) -> ConversationStore:
        path = state_dir(config) / DATABASE
        return cls(path, config.max_conversations_per_user, config.max_conversation_bytes_per_user)

    async def _run(self, fn, *args):
        if self._closed:
            raise StoreError("the server is shutting down")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, functools.partial(fn, *args))
        except (sqlite3.Error, msgspec.DecodeError) as e:  # a bad file, or a row edited by hand
            log.error("conversations: %s: %s", self.path, e)
            raise StoreError(f"the server could not use its conversation store ({e})") from None

    # --- what a connection asks ---

    async def list(self, user: str) -> list[ConversationSummary]:
        """The person's conversations, newest first (by when they were started)."""
        return await self._run(self._list, user)

    async def get(self, user: str, id: str) -> tuple[SavedConversation, ConversationSummary] | None:
        return await self._run(self._get, user, id)

    async def save(
        self, user: str, conversation: SavedConversation, base_revision: int | None = None
    ) -> ConversationSummary:
        """Store it whole (a new one, or a new revision); StoreFull past the person's bound,
        Conflict when `base_revision` is given and the stored one has another."""
        return await self._run(self._save, user, conversation, base_revision)

    async def rename(self, user: str, id: str, title: str) -> ConversationSummary | None:
        return await self._run(self._rename, user, id, title)

    async def delete(self, user: str, id: str) -> bool:
        return await self._run(self._delete, user, id)

    def close(self) -> None:
        self._closed = True
        self._thread.shutdown(wait=True)  # a save in progress commits first
        self._db.close()

    # --- on the store's thread ---

    def _list(self, user: str) -> list[ConversationSummary]:
        rows = self._db.execute(f"{SUMMARY} WHERE user = ? ORDER BY created DESC, id", (user,))
        return [ConversationSummary(*row) for row in rows]

    def _get(self, user: str, id: str) -> tuple[SavedConversation, ConversationSummary] | None:
        row = self._db.execute(
            "SELECT id, title, created, updated, revision, bytes, messages, model "
            "FROM conversations WHERE user = ? AND id = ?",
            (user, id),
        ).fetchone()
        if row is None:
            return None
        *summary, messages, model = row
        found = SavedConversation(row[0], row[1], row[2], _decode_messages(messages), model)
        return found, ConversationSummary(*summary)

    def _used(self, user: str) -> tuple[int, int]:
        count, size = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM conversations WHERE user = ?", (user,)
        ).fetchone()
        return count, size

    def _save(self, user: str, c: SavedConversation, base: int | None) -> ConversationSummary:
        messages = _encode_messages(c.messages)
        size = len(messages) + len(c.title.encode())
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            old = self._db.execute(
                "SELECT revision, bytes FROM conversations WHERE user = ? AND id = ?", (user, c.id)
            ).fetchone()
            count, used = self._used(user)
            revision, old_size = old if old else (0, 0)
            if base is not None and old is not None and base != revision:
                raise Conflict(
                    f"changed elsewhere meanwhile (revision {revision}, this copy is of {base})"
                )
            self._check_room(count + (old is None), used - old_size + size, old_size < size)
            now = _now_ms()
            self._db.execute(
                "INSERT OR REPLACE INTO conversations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (user, c.id, c.title, c.created, now, revision + 1, size, messages, c.model),
            )
        return ConversationSummary(c.id, c.title, c.created, now, revision + 1, size)

    def _check_room(self, count: int, size: int, grows: bool) -> None:
        if count > self.max_count:
            raise StoreFull(
                f"you keep {_conversations(self.max_count)} on this server, as many as it keeps "
                "for one person: delete old ones to save new ones"
            )
        if grows and size > self.max_bytes:
            raise StoreFull(
                f"your conversations on this server would take {_mib(size)} of the "
                f"{_mib(self.max_bytes)} it keeps for one person: delete old ones to save more"
            )

    def _rename(self, user: str, id: str, title: str) -> ConversationSummary | None:
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            old = self._db.execute(
                "SELECT title, bytes FROM conversations WHERE user = ? AND id = ?", (user, id)
            ).fetchone()
            if old is None:
                return None
            size = old[1] - len(old[0].encode()) + len(title.encode())
            count, used = self._used(user)
            self._check_room(count, used - old[1] + size, size > old[1])
            self._db.execute(
                "UPDATE conversations SET title = ?, bytes = ?, updated = ?, "
                "revision = revision + 1 WHERE user = ? AND id = ?",
                (title, size, _now_ms(), user, id),
            )
            row = self._db.execute(f"{SUMMARY} WHERE user = ? AND id = ?", (user, id)).fetchone()
        return ConversationSummary(*row)

    def _delete(self, user: str, id: str) -> bool:
        with self._db:
            gone = self._db.execute(
                "DELETE FROM conversations WHERE user = ? AND id = ?", (user, id)
            )
        return gone.rowcount > 0


def _connect(path: Path) -> sqlite3.Connection:
    """The database, created if need be; a file that is not one is said with what to do."""
    db = open_store(path, SCHEMA, SCHEMA_VERSION, "the conversation store", StoreUnusable, "")
    columns = {row[1] for row in db.execute("PRAGMA table_info(conversations)")}
    if "model" not in columns:  # written by schema 1: its conversations have no model
        db.execute("ALTER TABLE conversations ADD COLUMN model TEXT")
    return db


def _conversations(n: int) -> str:
    return f"{n} conversation{'' if n == 1 else 's'}"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
