"""What the engine tells the world: one list of events per step, in the order they happened.

`Token` carries a request's new text, `Embedded` an embedding request's vectors, `Done` its end
(reason, usage, timings), `Admitted` and `Preempted` its moves between waiting and running,
`WaitPredicted` its place in the queue and predicted wait while it waits
(localserve.engine.waits). The engine calls its `on_events` callback with each step's list on
the engine thread; `EventRouter` sorts them into one queue per request for synchronous callers
(the CLI, benchmarks, tests).

Tested in tests/unit/engine/test_engine.py.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import msgspec


class Token(msgspec.Struct, tag=True):
    request_id: str
    text: str  # may be empty: bytes of an unfinished character, or text held back for stops


class Done(msgspec.Struct, tag=True):
    request_id: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    timings: dict[str, float | None]  # queue_ms, ttft_ms, itl_ms, e2e_ms; None: never happened
    error: str = ""
    error_code: str = "internal"  # the protocol's code for an error: internal | unavailable
    stop: str = ""  # the stop string that ended the reply ("" for none: EOS, a grammar, ...)


class Embedded(msgspec.Struct, tag=True):
    """An embedding request's vectors: one per input, in input order, L2-normalised, each
    ModelInfo.n_embd long. Its Done follows in the same list."""

    request_id: str
    vectors: list[list[float]]


class Admitted(msgspec.Struct, tag=True):
    request_id: str


class Preempted(msgspec.Struct, tag=True):
    request_id: str


class WaitPredicted(msgspec.Struct, tag=True):
    """A waiting request's place in the order it would enter (1 = next) and about how many
    seconds from now it enters (None: not predictable now), sent when either changed."""

    request_id: str
    position: int
    wait_s: float | None


Event = Token | Done | Embedded | Admitted | Preempted | WaitPredicted
EventSink = Callable[[list[Event]], None]


class EventRouter:
    """Events to one blocking queue per request, for synchronous callers (CLI, benchmarks)."""

    def __init__(self) -> None:
        self._queues: dict[str, queue.SimpleQueue[Event]] = {}
        self._lock = threading.Lock()

    def open(self, request_id: str) -> queue.SimpleQueue[Event]:
        with self._lock:
            return self._queues.setdefault(request_id, queue.SimpleQueue())

    def __call__(self, events: list[Event]) -> None:
        for event in events:
            with self._lock:
                q = self._queues.get(event.request_id)
                if isinstance(event, Done):
                    self._queues.pop(event.request_id, None)
            if q is not None:
                q.put(event)
