"""The state directory's SQLite files, opened the one way the stores keep them.

Created private (0600, in a 0700 directory: who uses the server and what they asked are the
operator's only), in WAL mode with `synchronous = FULL` (a commit survives a crash, even power
loss), the schema created or checked by its version. A file that is not such a store (garbage,
another program's database, a newer schema) is refused with what to do about it, so the server
stops at start naming the file rather than failing at a person's first request.

The directory is made or checked private first, and a link in the file's place is refused
(ops/state_dir.py). Used by ops/conversations.py and ops/people.py; tested in
tests/e2e/test_conversation_store.py and tests/unit/ops/test_people.py (a file that is not a
store, a newer schema, a full disk, a file deleted or replaced under the store).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from localserve.ops.state_dir import no_link, private_dir

LOCK_TIMEOUT_S = 5.0  # another process holding the file (a second server on the same state dir)


def open_store(
    path: Path, schema: str, version: int, what: str, unusable: type[Exception], note: str = ""
) -> sqlite3.Connection:
    """`path`'s database (`what`: "the conversation store"), created if need be, its schema at
    `version`; `unusable(message)` raised for a file that cannot be one, `note` added to the
    advice to move it aside."""
    private_dir(path.parent)
    no_link(path, what)
    try:
        created = not path.exists()
        db = sqlite3.connect(
            path, timeout=LOCK_TIMEOUT_S, check_same_thread=False, isolation_level=None
        )
        if created:
            os.chmod(path, 0o600)
    except (OSError, sqlite3.Error) as e:
        raise unusable(f"{path}: cannot open {what}: {e}") from None
    try:
        _check_schema(db, path, schema, version, unusable)
    except sqlite3.Error as e:
        db.close()
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise unusable(
            f"{path}: not a usable {what.removeprefix('the ')} ({first}): move it aside to start "
            f"a new one{note}"
        ) from None
    except unusable:
        db.close()
        raise
    return db


def _check_schema(db, path: Path, schema: str, version: int, unusable: type[Exception]) -> None:
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    found = db.execute("PRAGMA user_version").fetchone()[0]
    tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if found > version:
        raise unusable(
            f"{path}: written by a newer localserve (schema {found}): upgrade, or set "
            "[server] state_dir elsewhere"
        )
    if found == 0 and tables:
        raise unusable(f"{path}: some other program's database: move it aside")
    db.execute(schema)
    db.execute(f"PRAGMA user_version = {version}")
