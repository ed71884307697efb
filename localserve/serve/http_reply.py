"""What every HTTP API's reply shares: the sink of one request's engine events and the ASGI
response that delivers them, watched for a client that goes away or stops reading.

`HttpReply` is the base of the OpenAI, Ollama and Anthropic replies (serve/openai/reply.py,
serve/ollama/reply.py, serve/anthropic/reply.py); each writes its own body shapes in
`_send_stream` and `_send_whole`, reading the text with `_next()`. What they share, here once:

- text that arrives while a write is blocked is coalesced into the next write; a streaming
  client that lets max_outbox_bytes pile up, or whose socket takes nothing for
  write_timeout_s, is cut off (the connection aborted) and its request cancelled;
- the client closing its connection cancels the request at the engine's next step (its cells
  freed), whether it streams or waits for the whole reply; while it is being admitted (its
  model loading, its prompt being built) too: `submit` watches the client then, and the
  request stops waiting at once and frees its place;
- a reply that was not delivered (gone, or failed) cancels its request too: every admitted
  request ends.

Tested in tests/e2e/test_openai_api.py, tests/e2e/test_ollama_api.py and
tests/e2e/test_anthropic_api.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable

from localserve.engine.events import Done
from localserve.protocol.frames import SamplingFields
from localserve.serve.door import BuildPrompt, Frontdoor, Request, Submission
from localserve.serve.tool_use import ReplyReading, ToolUse

log = logging.getLogger("localserve.serve.http_reply")

SSE = "text/event-stream; charset=utf-8"


class HttpReply:
    """One request's reply over HTTP: the sink the server calls with its events (on_token,
    on_queued, on_done) and the ASGI response. `api` names the front-end in the usage record."""

    api = "http"
    use: ToolUse | None = None  # what the reply is read for (calls, reasoning); None: text

    def __init__(self, door: Frontdoor, scope, stream: bool, client_id: str, user: str) -> None:
        self.door = door
        self.scope = scope
        self.stream = stream
        self.client_id = client_id
        self.user = user
        self.request: Request | None = None  # once admitted
        self.is_closed = False
        self.pending: list[str] = []
        self.num_pending_bytes = 0
        self.done: Done | None = None
        self.queue_note: tuple[int, float | None] | None = None  # waiting: place, wait (s)
        self._ready = asyncio.Event()
        # given to door.submit: the client gone before it was admitted (its model loading)
        self.cancelled = asyncio.Event()

    @functools.cached_property
    def reading(self) -> ReplyReading | None:
        """The reply's reading, made at its first text (the prompt it continues is known by
        then); None for plain text."""
        return self._reading()

    def _reading(self) -> ReplyReading | None:
        if self.use is None or self.request is None:
            return None
        return self.use.reading(self.door, self.request.prompt_tail)

    # the sink: called by the server with the engine's events

    def on_token(self, request: Request, text: str) -> None:
        self.pending.append(text)
        self.num_pending_bytes += self._size(text)
        limit = self.door.config.max_outbox_bytes
        if self.stream and self.num_pending_bytes > limit:
            self._give_up(f"not reading: over {limit} bytes unsent")
        self._ready.set()

    def on_queued(self, request: Request, position: int, wait_s: float | None = None) -> None:
        """A streamed reply tells a waiting client its place and predicted wait in a line
        it can ignore (`_queue_line`); a whole one has nowhere to say it."""
        if self.stream and not self.pending and self.done is None:
            self.queue_note = (position, wait_s)
            self._ready.set()

    def _queue_line(self, position: int, wait_s: float | None) -> bytes:
        """The stream's line for a waiting client: an SSE comment, which SSE clients ignore
        (Ollama's NDJSON has none: its reply writes an object of its own)."""
        wait = "" if wait_s is None else f" wait_s={wait_s:.1f}"
        return f": queued position={position}{wait}\n\n".encode()

    async def _send_queue_note(self, send) -> None:
        """The latest waiting note, if one came since the last write."""
        note, self.queue_note = self.queue_note, None
        if note is not None and not self.is_closed:
            await send({"type": "http.response.body", "body": self._queue_line(*note),
                        "more_body": True})  # fmt: skip

    def on_done(self, request: Request, done: Done) -> None:
        self.done = done
        self._ready.set()

    def _size(self, text: str) -> int:
        """The bytes `text` takes as it will be sent (what max_outbox_bytes counts)."""
        return len(text.encode())

    def _give_up(self, why: str) -> None:
        """The client is gone or not reading: cancel the request, cut the connection."""
        if self.is_closed:
            return
        self.is_closed = True
        log.warning("%s (%s): %s; request cancelled", self.client_id, self.user, why)
        self.cancelled.set()  # a request still being admitted stops at once
        if self.request is not None and self.done is None:
            self.door.cancel(self.request)
        transport = self.scope.get("extensions", {}).get("localserve")
        if transport is not None and why.startswith("not reading"):
            transport.abort()
        self._ready.set()

    async def submit(
        self, receive, number: int, fields: SamplingFields, prompt: BuildPrompt, **options
    ) -> Request | None:
        """The chat handed to the door as this reply's (a `Submission` with this reply as its
        sink, `number` the HTTP request's; `options`: the Submission's response_format,
        constraint, keep_alive_s), the client watched meanwhile: one that closes its connection
        while its model loads or its prompt is built cancels it (None). Refusal as the door's."""
        engine_id = f"{number}:{self.client_id}"
        submission = Submission(self, self.user, self.client_id, engine_id, fields, prompt,
                                cancelled=self.cancelled, **options)  # fmt: skip
        return await self._admitted(receive, self.door.submit(submission))

    async def _admitted(self, receive, admission: Awaitable[Request | None]) -> Request | None:
        """The request the door admits (`admission`: its submit, or its embed), the client
        watched meanwhile; one gone just as it reached the engine is cancelled."""
        watcher = asyncio.create_task(self._watch(receive))
        try:
            request = await admission
        finally:
            watcher.cancel()
        if request is not None and self.is_closed:  # gone just as it reached the engine
            self.door.cancel(request)
        return request

    # the ASGI response

    async def __call__(self, scope, receive, send) -> None:
        send = functools.partial(self._send_within_timeout, send)
        watcher = asyncio.create_task(self._watch(receive))
        try:
            if self.stream:
                await self._send_stream(send)
            else:
                await self._send_whole(send)
        finally:
            watcher.cancel()
            if self.done is None:  # gone, or this failed: nobody will read the rest
                self._give_up("the reply was not delivered")

    async def _send_stream(self, send) -> None:
        raise NotImplementedError

    async def _start_stream(self, send, headers: dict[str, str] | None = None,
                            content_type: str = SSE) -> None:  # fmt: skip
        """The streamed reply's start: 200, its content type, and nothing buffered between."""
        fields = [(b"content-type", content_type.encode()), (b"cache-control", b"no-cache"),
                  (b"x-accel-buffering", b"no"),
                  *((k.encode(), v.encode()) for k, v in (headers or {}).items())]  # fmt: skip
        await send({"type": "http.response.start", "status": 200, "headers": fields})

    async def _send_whole(self, send) -> None:
        raise NotImplementedError

    async def _watch(self, receive) -> None:
        """The client closing its connection (or stream) cancels the request."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return self._give_up("the client closed the connection")

    async def _next(self) -> tuple[str, Done | None]:
        """The text that came since the last call (coalesced), and the done once it came."""
        await self._ready.wait()
        self._ready.clear()
        text, self.pending, self.num_pending_bytes = "".join(self.pending), [], 0
        return text, self.done

    async def _whole(self) -> tuple[str, Done | None]:
        """The reply's whole text and its done (None: the client went away first)."""
        parts, done = [], None
        while not self.is_closed and done is None:
            text, done = await self._next()
            parts.append(text)
        return "".join(parts), None if self.is_closed else done

    async def _send_within_timeout(self, send, message) -> None:
        """Every write: a client whose socket takes nothing for write_timeout_s is cut off."""
        if self.is_closed:
            return
        timeout = self.door.config.write_timeout_s
        try:
            async with asyncio.timeout(timeout):
                await send(message)
        except TimeoutError:
            self._give_up(f"not reading for {timeout:g} s")

    def _unrecorded(self, body: dict) -> dict:
        """The reply's last object says `"recorded": false` when its usage row was not
        committed (a server without a usage record promises nothing: no key)."""
        request = self.request
        if self.door.records_usage and request is not None and not request.is_recorded:
            body["recorded"] = False
        return body


async def no_receive():
    """An ASGI receive for a response sent from inside another (the connection is watched)."""
    return {"type": "http.disconnect"}
