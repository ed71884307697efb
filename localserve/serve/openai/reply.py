"""One OpenAI reply: admitted like a websocket chat, then streamed as server-sent events or sent
whole.

`start_reply` passes the request to admission (`Frontdoor.submit`: the same users, limits,
prefix isolation and too-long check as a websocket chat) with a `Reply` as its sink. The reply
is the ASGI response too. Either way it goes, the client's connection is watched: a client that
goes away, or stops reading its stream, cancels its request at the next step (also
mid-prefill), and its cells are freed.

Tested in tests/e2e/test_openai_api.py; on a fake Frontdoor in tests/unit/serve/openai/.
"""

from __future__ import annotations

import functools
import secrets
from typing import Any

import msgspec
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from localserve.engine.events import Done
from localserve.serve.door import BuildPrompt, Frontdoor, Refusal
from localserve.serve.http_reply import HttpReply, no_receive
from localserve.serve.openai import errors
from localserve.serve.openai.read import ReadReply
from localserve.serve.openai.types import ReplyBodies, RequestFields
from localserve.serve.openai.validation import identify, sampling_fields
from localserve.serve.tool_use import NO_TOOLS, ToolUse

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
        admitted = await reply.submit(
            request.receive,
            num,
            fields,
            prompt,
            response_format=response_format,
            constraint=use.constraint,
        )
    except Refusal as e:
        raise errors.refused(e, kind) from None
    if admitted is None:  # the client left while its prompt was built
        return Response(status_code=499)
    reply.request = admitted
    reply.bodies.dropped_messages = admitted.num_dropped_messages
    return reply


class Reply(HttpReply):
    """One request's reply (serve/http_reply.py: the sink and its delivery), as OpenAI's SSE
    chunks or one JSON body."""

    api = "http"  # in the usage record

    def __init__(
        self, door: Frontdoor, scope, body: RequestFields, kind: str, client_id: str, user: str
    ) -> None:
        super().__init__(door, scope, bool(body.stream), client_id, user)
        self.kind = kind  # "chat" or "text"
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self.bodies = ReplyBodies(kind, client_id, door.model_name, include_usage)

    @functools.cached_property
    def reading(self) -> ReadReply | None:
        """The reply's reader (its reasoning and calls read out as it comes), made at its first
        text: the prompt it continues is known by then."""
        reading = self._reading()
        return None if reading is None else ReadReply(reading)

    def _size(self, text: str) -> int:
        return len(_encoder.encode(text))  # as it will be sent: JSON-escaped

    async def _send_whole(self, send) -> None:
        text, done = await self._whole()
        if done is None:
            return
        if done.finish_reason in ("error", "cancelled"):
            error = errors.failed(done, self.door.is_shutting_down)
            return await error.response()(self.scope, no_receive, send)
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
        await response(self.scope, no_receive, send)

    async def _send_stream(self, send) -> None:
        await self._start_stream(send, self._headers())
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
            await self._send_queue_note(send)
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

    def _headers(self) -> dict[str, str]:
        """A chat's reply says in a header too how many of its oldest messages were left out."""
        if self.kind != "chat":
            return {}
        return {DROPPED_HEADER: str(self.bodies.dropped_messages)}
