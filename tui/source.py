"""Where the monitor's numbers come from: the server's stats stream, or anything that yields.

A source is an async iterable of `Connected`, `Disconnected`, `Stats` and `Snapshot` items. The
websocket source subscribes to `stats` frames and reconnects, with backoff, whenever the server goes
away; it passes each frame on whole, so the monitor gets today's per-user totals
(`Stats.usage_today`) with the snapshot. A source without them (an in-process engine, a test) may
yield bare snapshots.

Tested in tests/unit/tui/test_monitor.py and tests/e2e/test_monitor.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from localserve.client import Client, ClientError, ConnectionClosed
from localserve.protocol.frames import Error, Stats, Subscribe
from localserve.protocol.snapshot import Snapshot


@dataclass(frozen=True)
class Connected:
    url: str


@dataclass(frozen=True)
class Disconnected:
    reason: str


SourceItem = Connected | Disconnected | Stats | Snapshot


class WebSocketSource:
    """Stats frames from a localserve server; reconnects forever."""

    def __init__(
        self,
        url: str,
        monitor_token: str | None = None,
        user: str | None = None,
        token: str | None = None,
        interval_ms: int = 500,
        max_retry_s: float = 5.0,
    ) -> None:
        self.url = url
        self.monitor_token = monitor_token
        self.user, self.token = user, token
        self.interval_ms = interval_ms
        self.max_retry_s = max_retry_s

    async def __aiter__(self) -> AsyncIterator[SourceItem]:
        retry = 0.25
        while True:
            try:
                client = await Client.connect(self.url, self.user, self.token)
                async with client:
                    await client.send(Subscribe(self.interval_ms, self.monitor_token))
                    yield Connected(self.url)
                    retry = 0.25
                    async for item in self._frames(client):
                        yield item
            except (OSError, ConnectionClosed, ClientError, TimeoutError) as e:
                yield Disconnected(str(e) or type(e).__name__)
            await asyncio.sleep(retry)
            retry = min(retry * 2, self.max_retry_s)

    async def _frames(self, client: Client) -> AsyncIterator[SourceItem]:
        while True:
            frame = await client.recv()
            if isinstance(frame, Stats):
                yield frame
            elif isinstance(frame, Error):
                raise ClientError(frame.code, frame.message)


class QueueSource:
    """Items pushed by hand (tests, or an in-process engine)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[SourceItem] = asyncio.Queue()

    def push(self, item: SourceItem) -> None:
        self.queue.put_nowait(item)

    async def __aiter__(self) -> AsyncIterator[SourceItem]:
        while True:
            yield await self.queue.get()
