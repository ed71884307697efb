"""Engine events back to the request they are for: its sink gets them on the server's loop.

The engine calls `on_engine_events` on its own thread; the events are handed to the loop with
`call_soon_threadsafe` and each goes to the sink of the request it names (a websocket
connection or an HTTP reply; an embedding request's vectors to its sink's `on_embedded`). A
`done` releases the request from admission and goes out once
its usage row is committed, or after RECORD_WAIT_S (at once while the record is known to be
broken) saying it was not: a reply never hangs on a dead disk.

Tested in tests/e2e/test_websocket_server.py and tests/e2e/test_usage_record.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from localserve.engine.events import (
    Admitted,
    Done,
    Embedded,
    Event,
    Preempted,
    Token,
    WaitPredicted,
)
from localserve.ops.usage import Usage
from localserve.ops.usage_database import Row
from localserve.serve.admission import Admission
from localserve.serve.door import Request

log = logging.getLogger("localserve.serve.routing")

RECORD_WAIT_S = 3.0  # a `done` waits this long for its usage row to be committed


class SinkRouter:
    """Routes the engine's events to the sinks of admission's requests; records each `done`."""

    def __init__(self, admission: Admission, usage: Callable[[], Usage | None]) -> None:
        self.admission = admission
        self._usage = usage
        self.num_unsent_dones = 0  # `done`s waiting for their usage row to be committed
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's, once it listens

    @property
    def usage(self) -> Usage | None:
        """The record the rows go to (the server's current one)."""
        return self._usage()

    def on_engine_events(self, events: list[Event]) -> None:
        """Called on the engine thread: hand over to the loop."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._dispatch, events)

    async def wait_for_dones(self, timeout: float) -> None:
        """Until every `done` is out (its row committed first), or `timeout` passed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self.num_unsent_dones:
                    await asyncio.sleep(0.01)

    def _dispatch(self, events: list[Event]) -> None:
        requests = self.admission.requests
        for event in events:
            request = requests.get(event.request_id)
            if request is not None:
                try:
                    self._route(request, event)
                except Exception:  # one request's trouble must not drop others' events
                    log.exception("request %s: routing %s failed", request.engine_id, event)

    def _route(self, request: Request, event: Event) -> None:
        sink = request.sink
        if isinstance(event, Token):
            if event.text:
                sink.on_token(request, event.text)
        elif isinstance(event, Done):
            if request.load_ms:  # its model loaded first: the wait is in its TTFT, and said
                _add_load(event.timings, request.load_ms)
            self.admission.release(request)
            if event.finish_reason == "error":
                log.error("request %s failed in the engine: %s", request.engine_id, event.error)
            self._record(request, event)
        elif isinstance(event, Embedded):  # its `done` follows
            sink.on_embedded(request, event.vectors)
        elif isinstance(event, Admitted):
            self.admission.started(request)
        elif isinstance(event, Preempted):
            sink.on_queued(request, self.admission.counts.waiting + 1)
        elif isinstance(event, WaitPredicted) and not request.loading and not sink.is_closed:
            sink.on_queued(request, event.position, event.wait_s)

    def _record(self, request: Request, event: Done) -> None:
        """Hand the row to the record; the `done` goes once it is committed, or after
        RECORD_WAIT_S (at once while the record is broken) saying it is not."""
        if self.usage is None:
            return self._deliver_done(request, event, recorded=False)
        loop, is_sent = self.loop, False

        def deliver(recorded: bool) -> None:  # whichever comes first: the commit or the timer
            nonlocal is_sent
            if not is_sent:
                is_sent = True
                timer.cancel()
                self.num_unsent_dones -= 1
                self._deliver_done(request, event, recorded)

        def committed(recorded: bool) -> None:  # on the writer thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
                loop.call_soon_threadsafe(deliver, recorded)

        timer = loop.call_later(0 if self.usage.problem else RECORD_WAIT_S, deliver, False)
        self.num_unsent_dones += 1
        try:
            self.usage.record(self._row(request, event), committed)
        except Exception:  # no record: the reply still ends
            log.exception("request %s: not recorded", request.engine_id)
            deliver(False)

    def _deliver_done(self, request: Request, event: Done, recorded: bool) -> None:
        """The `done`, saying whether its row is committed (on the loop)."""
        request.is_recorded = recorded
        try:
            request.sink.on_done(request, event)
        except Exception:
            log.exception("request %s: sending its done failed", request.engine_id)

    def _row(self, request: Request, event: Done) -> Row:
        t = event.timings
        return Row(
            finished=time.time(),
            user=request.user,
            model=request.model,
            request_id=request.engine_id,
            client_id=request.client_id,
            api=getattr(request.sink, "api", "websocket"),
            prompt_tokens=event.prompt_tokens,
            cached_tokens=event.cached_tokens,
            completion_tokens=event.completion_tokens,
            queue_ms=t.get("queue_ms"),
            ttft_ms=t.get("ttft_ms"),
            e2e_ms=t.get("e2e_ms"),
            finish_reason=event.finish_reason,
        )


def _add_load(timings: dict[str, float | None], load_ms: float) -> None:
    """A request that waited for its model to load: the wait counts in its queue, first-token
    and end-to-end times (measured by the engine from when it got the request), and `load_ms`
    says how much of them it was."""
    for key in ("queue_ms", "ttft_ms", "e2e_ms"):
        if timings.get(key) is not None:
            timings[key] += load_ms
    timings["load_ms"] = load_ms
