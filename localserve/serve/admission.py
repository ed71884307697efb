"""What every chat is on its way in, whichever way it came: a request, its sink, or a refusal.

A `Request` is created when the server admits a chat (`Server.submit`) and ends with the
engine's `done`. Its events go to its `Sink`: a websocket connection or an HTTP reply. A chat
the server will not take is a `Refusal` carrying the protocol's error code (docs/protocol.md),
which the websocket protocol sends as an `error` frame and the HTTP API maps to a status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from localserve.engine.events import Done

# a client refused (or cut short) because the engine process is down may retry this soon after
RETRY_UNAVAILABLE_S = 5


class Sink(Protocol):
    """Who gets a request's events: a websocket connection or an HTTP reply."""

    is_closed: bool

    def on_token(self, request: Request, text: str) -> None: ...
    def on_queued(self, request: Request, position: int) -> None: ...
    def on_done(self, request: Request, done: Done) -> None: ...


@dataclass(eq=False)
class Request:
    """A chat in flight: who asked, under which ids, and where its events go."""

    engine_id: str
    client_id: str
    user: str
    sink: Sink
    is_waiting: bool = True
    reserved_tokens: int = 0  # of its user's daily quota, until it is done
    is_recorded: bool = False  # its usage row committed when its `done` went out


class Refusal(Exception):
    """A chat the server will not take: a protocol error code and why."""

    def __init__(self, code: str, message: str, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.code, self.message, self.retry_after_s = code, message, retry_after_s
