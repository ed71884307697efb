"""The requests in flight and how many of them wait: in all, per user, and the busy refusals.

A request is in flight from its admission until its `done` is routed (or until it is refused
or cancelled before it reached the engine), and waits until the engine admits it to the
running batch. The counts are across every model and every front door: a user's cap on
requests in flight (`max_inflight_per_user`) and on queued ones, and the global queue, hold
whichever way the requests came. The event loop's, like the rest of admission.

Tested through the server in tests/e2e/test_websocket_connection.py and
tests/e2e/test_several_models.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from localserve.config import ServerConfig
from localserve.serve.door import Refusal, Request


@dataclass
class RequestCounts:
    """Requests in flight (admitted, `done` not yet routed) by engine id, and how many wait,
    in all and per user."""

    requests: dict[str, Request] = field(default_factory=dict)
    waiting: int = 0
    waiting_per_user: dict[str, int] = field(default_factory=dict)
    inflight_per_user: dict[str, int] = field(default_factory=dict)

    def add(self, request: Request) -> None:
        """Admitted: in flight, and waiting."""
        self.requests[request.engine_id] = request
        self._count(request.user, waiting=+1, inflight=+1)

    def remove(self, request: Request) -> bool:
        """No longer in flight; False when it was not (released already)."""
        if self.requests.pop(request.engine_id, None) is None:
            return False
        self._count(request.user, waiting=-1 if request.is_waiting else 0, inflight=-1)
        return True

    def started(self, request: Request) -> None:
        """The engine admitted it to the running batch: it no longer counts as waiting."""
        if request.is_waiting:
            self._count(request.user, waiting=-1, inflight=0)
            request.is_waiting = False

    def busy(self, user: str, config: ServerConfig) -> Refusal | None:
        """The refusal of a new chat of the user's past the caps on requests in flight and
        waiting (the user's, and the server's queue), else None."""
        c = config
        if self.inflight_per_user.get(user, 0) >= c.max_inflight_per_user:
            message = f"{c.max_inflight_per_user} requests of yours are already in flight"
            return Refusal("busy", message, retry_after_s=1)
        if self.waiting_per_user.get(user, 0) >= c.max_queued_per_user:
            message = f"{c.max_queued_per_user} requests of yours are already queued"
            return Refusal("busy", message, retry_after_s=1)
        if self.waiting >= c.max_queued:
            message = f"the queue is full ({c.max_queued} waiting); try again shortly"
            return Refusal("busy", message, retry_after_s=1)
        return None

    def loading(self) -> dict[str, int]:
        """The requests waiting for their model to load, per model."""
        per_model: dict[str, int] = {}
        for request in self.requests.values():
            if request.loading:
                per_model[request.model] = per_model.get(request.model, 0) + 1
        return per_model

    async def wait_for_none(self, timeout: float) -> None:
        """Until no request is in flight, or `timeout` passed."""
        with contextlib.suppress(asyncio.TimeoutError):
            async with asyncio.timeout(timeout):
                while self.requests:
                    await asyncio.sleep(0.02)

    def _count(self, user: str, waiting: int, inflight: int) -> None:
        self.waiting += waiting
        self.waiting_per_user[user] = self.waiting_per_user.get(user, 0) + waiting
        self.inflight_per_user[user] = self.inflight_per_user.get(user, 0) + inflight
        for table in (self.waiting_per_user, self.inflight_per_user):
            if not table[user]:
                del table[user]
