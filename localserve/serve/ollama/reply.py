"""One Ollama reply: admitted like any chat, then streamed as NDJSON (one JSON object a line,
Ollama's default) or sent whole (`"stream": false`).

`start_reply` passes the request to admission (`Frontdoor.submit`: the same users, limits,
fairness, quotas and usage rows as every request; `api` "ollama" in the usage record) with an
`OllamaReply` as its sink, which is the ASGI response too. The client's connection is watched
either way: a client that goes away, or stops reading, cancels its request at the next step and
its cells are freed. A chat's reply is read (serve/tool_use.py) for its reasoning, shown as
`message.thinking`, and its calls, shown as `message.tool_calls` with their arguments an object.

Tested in tests/e2e/test_ollama_api.py; on a fake Frontdoor in tests/unit/serve/ollama/.
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime
from typing import Any

import msgspec
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from localserve.chat.reply import ReasoningText
from localserve.chat.tool_calls import ContentDelta
from localserve.engine.events import Done
from localserve.protocol.frames import SamplingFields
from localserve.serve.door import BuildPrompt, Frontdoor, Refusal
from localserve.serve.http_reply import HttpReply, no_receive
from localserve.serve.ollama import errors
from localserve.serve.ollama.validation import public_name
from localserve.serve.tool_use import NO_TOOLS, ToolUse

_encoder = msgspec.json.Encoder()
NS_PER_MS = 1_000_000


async def start_reply(
    door: Frontdoor,
    request: HttpRequest,
    user: str,
    kind: str,
    stream: bool,
    fields: SamplingFields,
    prompt: BuildPrompt,
    response_format: Any = None,
    use: ToolUse = NO_TOOLS,
    model: str | None = None,
    keep_alive_s: float | None = None,
) -> Response:
    """Admit a chat (`kind` "chat": /api/chat's objects) or a generation ("generate"); its
    objects name the model as the request did (`model`; None: the tagged name)."""
    num = door.next_number()
    client_id = f"ollama-{num}{secrets.token_hex(4)}"
    reply = OllamaReply(door, request.scope, kind, stream, client_id, user, use)
    reply.model = model or public_name(door)
    try:
        admitted = await reply.submit(
            request.receive,
            num,
            fields,
            prompt,
            response_format=response_format,
            constraint=use.constraint,
            keep_alive_s=keep_alive_s,
        )
    except Refusal as e:
        raise errors.refused(e) from None
    if admitted is None:  # the client left while its prompt was built
        return Response(status_code=499)
    reply.request = admitted
    return reply


def created_at() -> str:
    """Now as Ollama writes it: RFC 3339 in UTC."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class OllamaReply(HttpReply):
    """One request's reply (serve/http_reply.py: the sink and its delivery), as NDJSON lines
    or one JSON object."""

    api = "ollama"  # in the usage record

    def __init__(
        self, door: Frontdoor, scope, kind: str, stream: bool, client_id: str, user: str,
        use: ToolUse,
    ) -> None:  # fmt: skip
        super().__init__(door, scope, stream, client_id, user)
        self.kind = kind
        self.use = use
        self.model = public_name(door)  # as the request named it
        self.started = time.monotonic()

    async def _send_whole(self, send) -> None:
        text, done = await self._whole()
        if done is None:
            return
        if done.finish_reason in ("error", "cancelled"):
            error = errors.failed(done, self.door.is_shutting_down)
            return await error.response()(self.scope, no_receive, send)
        content, thinking, calls = self._read(text, True)
        body = self._object(content, thinking, calls) | self._done_fields(done)
        response = Response(_encoder.encode(body), media_type="application/json")
        await response(self.scope, no_receive, send)

    async def _send_stream(self, send) -> None:
        await self._start_stream(send, content_type="application/x-ndjson")
        done = None
        while done is None and not self.is_closed:
            text, done = await self._next()
            await self._send_queue_note(send)
            content, thinking, calls = self._read(text, done is not None)
            if content or thinking or calls:
                await self._write(send, self._object(content, thinking, calls))
        if self.is_closed or done is None:
            return
        if done.finish_reason in ("error", "cancelled"):
            await self._write(send, errors.failed(done, self.door.is_shutting_down).body())
        else:
            await self._write(send, self._object("", "", []) | self._done_fields(done))
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _read(self, text: str, is_last: bool) -> tuple[str, str, list[dict]]:
        """The content, thinking and calls this piece of text settles (the last: what was
        held back too); Ollama sends a call whole, its arguments an object."""
        reading = self.reading
        if reading is None:
            return text, "", []
        events = reading.feed(text)
        calls = []
        if is_last:
            held, made = reading.finish()
            events += held
            calls = [{"function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                     for c in made]  # fmt: skip
        content = "".join(e.text for e in events if isinstance(e, ContentDelta))
        thinking = "".join(e.text for e in events if isinstance(e, ReasoningText))
        return content, thinking, calls

    def _object(self, content: str, thinking: str, calls: list[dict]) -> dict:
        body: dict[str, Any] = {"model": self.model, "created_at": created_at()}
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            body["message"] = message
        else:
            body["response"] = content
            if thinking:
                body["thinking"] = thinking
        body["done"] = False
        return body

    def _done_fields(self, done: Done) -> dict:
        """The last object's: why it stopped, the counts and the durations in nanoseconds
        (load_duration 0: the one model is always loaded)."""
        t = done.timings
        queue = t.get("queue_ms") or 0.0
        ttft = t.get("ttft_ms") or queue
        total = t.get("e2e_ms") or (time.monotonic() - self.started) * 1000
        out = {
            "done": True,
            "done_reason": "length" if done.finish_reason == "length" else "stop",
            "total_duration": int(total * NS_PER_MS),
            "load_duration": 0,
            "prompt_eval_count": done.prompt_tokens,
            "prompt_eval_duration": int(max(0.0, ttft - queue) * NS_PER_MS),
            "eval_count": done.completion_tokens,
            "eval_duration": int(max(0.0, total - ttft) * NS_PER_MS),
        }
        return self._unrecorded(out)

    def _queue_line(self, position: int, wait_s: float | None) -> bytes:
        """NDJSON has no comments: a waiting client gets an empty chunk (not done) with a
        `queue` object, which Ollama's clients read past (its content is empty)."""
        queue: dict[str, Any] = {"position": position}
        if wait_s is not None:
            queue["wait_s"] = round(wait_s, 1)
        return _encoder.encode(self._object("", "", []) | {"queue": queue}) + b"\n"

    async def _write(self, send, obj: dict) -> None:
        data = _encoder.encode(obj) + b"\n"
        await send({"type": "http.response.body", "body": data, "more_body": True})


def _arguments(text: str) -> Any:
    """A call's arguments as Ollama sends them: the JSON object (the text if it is not one)."""
    try:
        return json.loads(text)
    except ValueError:
        return text
