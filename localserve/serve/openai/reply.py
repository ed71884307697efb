"""One OpenAI reply: admitted like a websocket chat, then streamed as server-sent events or sent
whole.

`start_reply` passes the request to admission (`Frontdoor.submit`: the same users, limits,
prefix isolation and too-long check as a websocket chat) with a `Reply` as its sink. The reply
is the ASGI response too. Either way it goes, the client's connection is watched: a client that
goes away, or stops reading its stream, cancels its request at the next step (also
mid-prefill), and its cells are freed.

Tested in tests/e2e/test_openai_api.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
from typing import Any

import msgspec
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from localserve.engine.events import Done
from localserve.serve.admission import BuildPrompt, Frontdoor, Refusal, Request
from localserve.serve.openai import errors
from localserve.serve.openai.read import ReadReply
from localserve.serve.openai.types import ReplyBodies, RequestFields
from localserve.serve.openai.validation import identify, sampling_fields
from localserve.serve.tool_use import NO_TOOLS, ToolUse

log = logging.getLogger("localserve.serve.openai.reply")

_encoder = msgspec.json.Encoder()
_MARK = "\x00"  # stands for a chunk's text in its encoded template
_MARK_JSON = _encoder.encode(_MARK)
DROPPED_HEADER = "x-localserve-dropped-messages"  # a chat's messages left out (context_overflow)


async def start_reply(
    door: Frontdoor,
    request: HttpRequest,
    body: RequestFields,
    kind: str,
    max_tokens: int | None,
    prompt: BuildPrompt,
    response_format: Any = None,
    use: ToolUse = NO_TOOLS,
) -> Response:
    """Admit a chat ("chat") or text completion ("text"); its reply, or the refusal's error.
    `response_format` (chat only) constrains the reply (admission compiles it); `use`: its
    tools (a forced call's grammar, what the reply is read for)."""
    user = await identify(door, request, body.user)
    config = door.config
    fields = sampling_fields(body, max_tokens, min(config.default_max_tokens, config.max_tokens))
    num = door.next_number()
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    client_id = f"{prefix}-{num}{secrets.token_hex(4)}"
    reply = Reply(door, request.scope, body, kind, client_id, user)
    reply.use = use if kind == "chat" else None
    try:
        admitted = await door.submit(
            reply,
            user,
            client_id,
            f"{num}:{client_id}",
            fields,
            prompt,
            response_format,
            constraint=use.constraint,
        )
    except Refusal as e:
        raise errors.refused(e, kind) from None
    if admitted is None:  # the client left while its prompt was built
        return Response(status_code=499)
    reply.request = admitted
    reply.bodies.dropped_messages = admitted.num_dropped_messages
    return reply


class Reply:
    """One request's reply: the sink of its engine events and the ASGI response that sends it.

    Streaming, text is written as it comes; text that arrives while a write is blocked is
    coalesced into the next event, and a client that lets max_outbox_bytes pile up, or takes
    nothing for write_timeout_s, is cut off and its request cancelled.
    """

    api = "http"  # in the usage record

    def __init__(
        self, door: Frontdoor, scope, body: RequestFields, kind: str, client_id: str, user: str
    ) -> None:
        self.door = door
        self.scope = scope
        self.kind = kind  # "chat" or "text"
        self.client_id = client_id
        self.user = user
        self.stream = bool(body.stream)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self.bodies = ReplyBodies(kind, client_id, door.model_name, include_usage)
        self.request: Request | None = None
        self.is_closed = False
        self.pending: list[str] = []
        self.num_pending_bytes = 0
        self.done: Done | None = None
        self.use: ToolUse | None = None  # a chat's tools: what its reply is read for
        self._ready = asyncio.Event()

    @functools.cached_property
    def reading(self) -> ReadReply | None:
        """The reply's reader (its reasoning and calls read out as it comes), made at its first
        text: the prompt it continues is known by then."""
        if self.use is None or self.request is None:
            return None
        reading = self.use.reading(self.door, self.request.prompt_tail)
        return None if reading is None else ReadReply(reading)

    # the sink: called by the server with the engine's events

    def on_token(self, request: Request, text: str) -> None:
        self.pending.append(text)
        self.num_pending_bytes += len(_encoder.encode(text))  # as it will be sent
        limit = self.door.config.max_outbox_bytes
        if self.stream and self.num_pending_bytes > limit:
            self._give_up(f"not reading: over {limit} bytes unsent")
        self._ready.set()

    def on_queued(self, request: Request, position: int) -> None:
        pass

    def on_done(self, request: Request, done: Done) -> None:
        self.done = done
        self._ready.set()

    def _give_up(self, why: str) -> None:
        """The client is gone or not reading: cancel the request, cut the connection."""
        if self.is_closed:
            return
        self.is_closed = True
        log.warning("%s (%s): %s; request cancelled", self.client_id, self.user, why)
        if self.request is not None and self.done is None:
            self.door.cancel(self.request)
        transport = self.scope.get("extensions", {}).get("localserve")
        if transport is not None and why.startswith("not reading"):
            transport.abort()
        self._ready.set()

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

    async def _watch(self, receive) -> None:
        """The client closing its connection (or stream) cancels the request."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return self._give_up("the client closed the connection")

    async def _next(self) -> tuple[str, Done | None]:
        await self._ready.wait()
        self._ready.clear()
        text, self.pending, self.num_pending_bytes = "".join(self.pending), [], 0
        return text, self.done

    async def _send_whole(self, send) -> None:
        parts = []
        while not self.is_closed:
            text, done = await self._next()
            parts.append(text)
            if done is not None:
                break
        if self.is_closed or done is None:
            return
        if done.finish_reason in ("error", "cancelled"):
            error = errors.failed(done, self.door.is_shutting_down)
            return await error.response()(self.scope, _no_receive, send)
        text = "".join(parts)
        if self.reading is None:
            body = self.bodies.whole(text, done)
        else:
            read = self.reading.whole(text)
            finish = "tool_calls" if read.calls else done.finish_reason
            body = self.bodies.whole(read.content, done, read.reasoning, read.calls, finish)
        body = self._unrecorded(body)
        response = Response(
            _encoder.encode(body), media_type="application/json", headers=self._headers()
        )
        await response(self.scope, _no_receive, send)

    async def _send_stream(self, send) -> None:
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
            *((k.encode(), v.encode()) for k, v in self._headers().items()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        bodies = self.bodies
        if self.kind == "chat":
            await self._write(send, bodies.chunk({"role": "assistant", "content": ""}))
        # every text chunk is the same JSON but for its text: encode that once
        head, tail = _encoder.encode(
            bodies.chunk({"content": _MARK} if self.kind == "chat" else _MARK)
        ).split(_MARK_JSON)
        head, tail = b"data: " + head, tail + b"\n\n"
        done = None
        reading = self.reading
        while done is None and not self.is_closed:
            text, done = await self._next()
            if text and reading is None:
                await self._write_bytes(send, head + _encoder.encode(text) + tail)
            elif reading is not None:
                for delta in reading.deltas(text, done is not None):
                    await self._write(send, bodies.chunk(delta))
        if self.is_closed or done is None:
            return
        await self._end_stream(send, done)
        await self._write(send, None)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _end_stream(self, send, done: Done) -> None:
        """The stream's last chunk (the usage after it when asked for), or its error."""
        if done.finish_reason in ("error", "cancelled"):
            error = errors.failed(done, self.door.is_shutting_down)
            payload = {
                "error": {
                    "message": error.message,
                    "type": error.kind,
                    "code": error.code,
                    "param": None,
                }
            }
            return await self._write(send, payload)
        finish = done.finish_reason
        if self.reading is not None and self.reading.num_calls:
            finish = "tool_calls"
        last = self.bodies.chunk({} if self.kind == "chat" else "", finish)
        if self.bodies.include_usage:
            await self._write(send, last)
            last = self.bodies.usage_chunk(done)
        await self._write(send, self._unrecorded(last))

    async def _write(self, send, event) -> None:
        data = b"data: [DONE]\n\n" if event is None else b"data: %s\n\n" % _encoder.encode(event)
        await self._write_bytes(send, data)

    async def _write_bytes(self, send, data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})

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

    def _headers(self) -> dict[str, str]:
        """A chat's reply says in a header too how many of its oldest messages were left out."""
        if self.kind != "chat":
            return {}
        return {DROPPED_HEADER: str(self.bodies.dropped_messages)}

    def _unrecorded(self, body: dict) -> dict:
        """The reply's last object says `"recorded": false` when its usage row was not
        committed (a server without a usage record promises nothing: no key)."""
        request = self.request
        if self.door.records_usage and request is not None and not request.is_recorded:
            body["recorded"] = False
        return body


async def _no_receive():
    return {"type": "http.disconnect"}
