"""An ASGI app driven in memory from the test's own event loop: one HTTP exchange, or one
websocket, with every message the app sends kept in order and the client's side (its body, its
frames, its going away) played by the test. No socket is opened (the rule of tests/unit/).

The front doors' unit tests (tests/unit/serve/<door>/) use it where a whole-response client
(Starlette's TestClient, httpx's ASGITransport) cannot look: the chunks of a stream as each
is written, and a client that leaves in the middle of one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

WAIT_S = 30.0  # what a test waits at most for the app to say something


async def wait_for(predicate: Callable[[], object], timeout: float = WAIT_S, what: str = ""):
    """Until `predicate()` is true (its value), yielding to the app between looks; a test
    failure naming `what` when it is not within `timeout`."""
    try:
        async with asyncio.timeout(timeout):
            while not (value := predicate()):
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"waited {timeout:g} s for {what or predicate}") from None
    return value


class HttpExchange:
    """One HTTP request to an ASGI app: the app runs as a task; `messages` is what it sent."""

    def __init__(self, app, method: str, path: str, body=None, headers=None) -> None:
        self.app = app
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        self._body: bytes | None = data or b""
        # a dict, or (name, value) pairs where a header comes more than once
        pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        sent = [("content-type", "application/json"), *pairs]
        if data is not None and "content-length" not in dict(pairs):
            sent.append(("content-length", str(len(data))))
        path, _, query = path.partition("?")
        self.scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(k.lower().encode(), v.encode("latin-1")) for k, v in sent],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
            "extensions": {},
        }
        self.messages: list[dict] = []
        self._gone = asyncio.Event()
        self._writable = asyncio.Event()  # cleared: the client's socket takes nothing
        self._writable.set()
        self.task: asyncio.Task | None = None

    def start(self) -> HttpExchange:
        self.task = asyncio.create_task(self.app(self.scope, self._receive, self._send))
        return self

    def leave(self) -> None:
        """The client closes its connection (the app's next receive says so)."""
        self._gone.set()

    def stall(self) -> None:
        """The client stops reading: every write the app makes from now on waits."""
        self._writable.clear()

    async def finished(self, timeout: float = WAIT_S) -> HttpExchange:
        """The app's answer, once it has ended."""
        await asyncio.wait_for(asyncio.shield(self.task), timeout)
        return self

    async def _receive(self) -> dict:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict) -> None:
        await self._writable.wait()
        self.messages.append(message)

    @property
    def status(self) -> int | None:
        starts = [m for m in self.messages if m["type"] == "http.response.start"]
        return starts[0]["status"] if starts else None

    @property
    def headers(self) -> dict[str, str]:
        starts = [m for m in self.messages if m["type"] == "http.response.start"]
        return {k.decode(): v.decode() for k, v in starts[0]["headers"]} if starts else {}

    @property
    def chunks(self) -> list[bytes]:
        """The body as the app wrote it, one item per write (empty writes left out)."""
        return [m["body"] for m in self.messages if m["type"] == "http.response.body" and m["body"]]

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    @property
    def is_complete(self) -> bool:
        """The app sent its last body message (more_body false)."""
        return any(
            m["type"] == "http.response.body" and not m.get("more_body", False)
            for m in self.messages
        )

    def json(self):
        return json.loads(self.body)


async def exchange(app, method: str, path: str, body=None, headers=None) -> HttpExchange:
    """A request the app answers by itself, run to its end."""
    return await HttpExchange(app, method, path, body, headers).start().finished()


def call(app, method: str, path: str, body=None, headers=None) -> HttpExchange:
    """`exchange` in an event loop of its own, for tests that need nothing else running."""
    return asyncio.run(exchange(app, method, path, body, headers))


class WebsocketSession:
    """One websocket as an ASGI callable sees it: frames in as the test says them, every
    message the app sends kept (`sent`), its text frames decoded (`frames`)."""

    def __init__(self) -> None:
        self._inbox: asyncio.Queue[dict] = asyncio.Queue()
        self.sent: list[dict] = []
        self.scope = {
            "type": "websocket",
            "path": "/",
            "headers": [],
            "client": ("127.0.0.1", 50001),
            "extensions": {},
        }

    async def receive(self) -> dict:
        return await self._inbox.get()

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    def say(self, frame) -> None:
        """A text frame from the client: a dict as JSON, or the text as it is."""
        text = frame if isinstance(frame, str) else json.dumps(frame)
        self._inbox.put_nowait({"type": "websocket.receive", "text": text})

    def say_bytes(self, data: bytes) -> None:
        self._inbox.put_nowait({"type": "websocket.receive", "bytes": data})

    def leave(self) -> None:
        """The client closes the socket."""
        self._inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})

    @property
    def frames(self) -> list[dict]:
        return [json.loads(m["text"]) for m in self.sent if m["type"] == "websocket.send"]

    def of(self, kind: str, request_id: str | None = None) -> list[dict]:
        """The frames of one type (and of one request), in order."""
        return [
            f
            for f in self.frames
            if f["type"] == kind and (request_id is None or f.get("id") == request_id)
        ]

    async def next_of(self, kind: str, request_id: str | None = None, n: int = 1) -> dict:
        """The `n`th frame of that type (and request), once it has come."""
        await wait_for(lambda: len(self.of(kind, request_id)) >= n, what=f"{kind} frame {n}")
        return self.of(kind, request_id)[n - 1]
