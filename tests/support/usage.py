"""Rows of the usage record (localserve/ops/usage.py) made, committed and read back, and a small
disk that fills up (the `small_disk` fixture)."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

from localserve.ops import usage_database
from localserve.ops.usage import Usage
from localserve.ops.usage_database import Row


def row(user="ann", t=None, prompt=10, cached=4, completion=5, ttft=100.0, **kw) -> Row:
    fields = dict(
        finished=time.time() if t is None else t,
        user=user,
        model="fake",
        request_id="1:r",
        client_id="r",
        api="websocket",
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        queue_ms=1.0,
        ttft_ms=ttft,
        e2e_ms=200.0,
        finish_reason="stop",
    )
    return Row(**(fields | kw))


def recorded(store: Usage, *rows: Row) -> None:
    """Record rows and wait until all are committed."""
    committed = threading.Semaphore(0)
    for r in rows:
        store.record(r, lambda is_recorded: is_recorded and committed.release())
    for _ in rows:
        assert committed.acquire(timeout=30)


class Disk:
    """A small tmpfs: a state directory on a disk that fills up."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / "filler"

    def fill(self) -> None:
        """Write a file until the disk is full (as another program on the machine would)."""
        with open(self.filler, "ab", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)

    def free(self) -> None:
        self.filler.unlink()


def rows_where(store: Usage, client_id: str) -> list[Row]:
    """The committed rows of a request, read as another process would."""
    db = usage_database.connect(store.path, readonly=True)
    try:
        return usage_database.rows_of(db, "client_id = ?", [client_id])
    finally:
        db.close()
