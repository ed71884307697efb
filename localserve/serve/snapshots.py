"""The engine's snapshots, shared: however many ask at once, the engine makes one.

/healthz, /metrics and every monitor's stats frames ask for the engine's state; askers who come
while a snapshot is on its way wait for that one, so any number of them cost the engine at most
one snapshot per step. An engine that gives none within SNAPSHOT_TIMEOUT_S has a problem: the
askers get a TimeoutError, and `last` is the one that came before; `fetch_within` gives an
asker who cannot wait (/metrics, the stats frames) `last` sooner (the engine process itself
answers within half a second, from its last snapshot while a step runs). With several models the
server's snapshots are those of the engine `source` names at each fetch (pool.py's primary:
the default model when it is loaded); while no model is loaded, NoModelLoaded.

Tested in tests/e2e/test_engine_faults.py and tests/e2e/test_grafana_metrics.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from localserve.engine.client import EngineClient
from localserve.protocol.snapshot import Snapshot

SNAPSHOT_TIMEOUT_S = 30.0  # an engine that gives no snapshot in this long has a problem


class NoModelLoaded(Exception):
    """No engine to ask: every model is unloaded (or still loading)."""


class Snapshots:
    """The engine's next snapshot, one for all who ask while it is on its way."""

    def __init__(self, engine: EngineClient | Callable[[], EngineClient | None]) -> None:
        # one engine, or a function naming the engine to ask now (None: no model loaded)
        self._source = engine if callable(engine) and not isinstance(engine, EngineClient) else (
            lambda: engine
        )  # fmt: skip
        self.last: Snapshot | None = None  # the last one that came
        self._coming: asyncio.Future[Snapshot] | None = None  # on its way from the engine

    async def fetch(self) -> Snapshot:
        """The engine's next snapshot, shared with everyone who asks while it comes."""
        if self._coming is None:
            self._coming = asyncio.ensure_future(self._fetch())
        return await asyncio.shield(self._coming)  # one asker giving up cancels nothing

    async def fetch_within(self, timeout_s: float) -> Snapshot:
        """The next snapshot if it comes within `timeout_s`, else the last one (a TimeoutError
        when none ever came)."""
        try:
            async with asyncio.timeout(timeout_s):
                return await self.fetch()
        except TimeoutError:
            if self.last is None:
                raise
            return self.last

    async def _fetch(self) -> Snapshot:
        try:
            engine = self._source()
            if engine is None:
                raise NoModelLoaded("no model is loaded")
            async with asyncio.timeout(SNAPSHOT_TIMEOUT_S):  # a stuck engine must not hang us
                snap = self.last = await asyncio.wrap_future(engine.snapshot())
                return snap
        finally:
            self._coming = None
