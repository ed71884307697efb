"""Waiting for a model to be ready: a request's wait while its model loads, a warm-up, a
prompt builder asked for.

The pool (pool.py) loads a model on demand; whoever needs it loaded waits here, at most
`[server] max_model_wait_s`. A request waiting tells its sink so (`queued` with `loading`:
what it waits for, a load or a swap's turn) and stops waiting at once when cancelled, the load
going on for the others. A load that fails, or a wait too long, is an `unavailable` refusal
with when to try again.

Tested in tests/unit/serve/test_admission.py (on a pool of fake runners) and through the
server in tests/e2e/test_several_models.py.
"""

from __future__ import annotations

import asyncio
import time
from asyncio import FIRST_COMPLETED as FIRST
from collections.abc import Callable

from localserve.config import ServerConfig
from localserve.serve.door import Refusal, Request
from localserve.serve.pool import RETRY_LOAD_S, LoadFailure, ModelPool, ModelSlot
from localserve.serve.prompt import PromptBuilder


class ModelWaits:
    """Waits for the pool's models (the event loop's); `num_waiting` is the queue's length a
    waiting request's sink is told."""

    def __init__(
        self, pool: ModelPool, config: Callable[[], ServerConfig], num_waiting: Callable[[], int]
    ) -> None:
        self.pool = pool
        self._config = config
        self._num_waiting = num_waiting

    async def ready(self, slot: ModelSlot, held: bool = False) -> None:
        """Until the model is loaded; Refusal (unavailable) when it cannot be, or not within
        max_model_wait_s."""
        limit = self._config().max_model_wait_s
        try:
            await asyncio.wait_for(self.pool.ready(slot, lambda reason: None, held), limit)
        except LoadFailure as e:
            raise Refusal("unavailable", e.message, max(e.retry_after_s, 1)) from None
        except TimeoutError:
            message = f"model {slot.name} was not ready within {limit:g} s"
            raise Refusal("unavailable", message, RETRY_LOAD_S) from None

    async def loaded_prompts(self, slot: ModelSlot) -> PromptBuilder:
        """The model's prompt builder, loading the model if it is not."""
        await self.ready(slot)
        return slot.prompts

    async def warm(self, slot: ModelSlot, keep_alive_s: float | None) -> None:
        """Load the model and give it `keep_alive_s` (0: unload it now when it is idle, without
        loading it): Ollama's empty request."""
        if keep_alive_s == 0 and not slot.is_loaded:
            return
        self.pool.acquire(slot)
        try:
            if keep_alive_s != 0:
                await self.ready(slot, held=True)
        finally:
            self.pool.release(slot, keep_alive_s)  # its timer armed, or unloaded at once

    async def wait_for(self, request: Request, slot: ModelSlot) -> None:
        """Until the request's model is loaded or the request is cancelled; its sink is told
        it waits (`loading`), and why when it waits for memory. LoadFailure when the model
        cannot be loaded. A cancelled request stops waiting at once: pool.ready's wait is
        shielded, so the load goes on for the others (and ends idle when none is left)."""
        started = time.monotonic()

        def waiting(reason: str) -> None:
            if reason == request.loading:  # told already
                return
            request.loading = reason
            if not request.sink.is_closed:
                request.sink.on_queued(request, self._num_waiting())

        turn = f"waiting for its turn: model {slot.yielding_to} loads first"
        waiting(turn if slot.yielding_to else f"loading model {slot.name}")
        ready = asyncio.ensure_future(
            self.pool.ready(slot, waiting, held=True, person=request.user)
        )
        cancelled = asyncio.ensure_future(request.cancelled.wait())
        limit = self._config().max_model_wait_s
        try:
            await asyncio.wait((ready, cancelled), timeout=limit, return_when=FIRST)
            if not ready.done() and not cancelled.done():
                why = request.loading
                raise LoadFailure(
                    f"model {slot.name} was not ready within {limit:g} s ({why})", RETRY_LOAD_S
                )
        finally:
            cancelled.cancel()
            if not ready.done():  # its hold on the slot is back before the caller releases it
                ready.cancel()
                await asyncio.wait({ready})
            request.loading = ""
            request.load_ms = (time.monotonic() - started) * 1e3
        if ready.done() and not ready.cancelled():
            ready.result()  # its LoadFailure
