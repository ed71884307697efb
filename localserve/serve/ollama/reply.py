"""One Ollama reply: admitted like any chat, then streamed as NDJSON (one JSON object a line,
Ollama's default) or sent whole (`"stream": false`).

`start_reply` passes the request to admission (`Frontdoor.submit`: the same users, limits,
fairness, quotas and usage rows as every request; `api` "ollama" in the usage record) with an
`OllamaReply` as its sink, which is the ASGI response too. The client's connection is watched
either way: a client that goes away, or stops reading, cancels its request at the next step and
its cells are freed. A chat's reply is read (serve/tool_use.py) for its reasoning, shown as
`message.thinking`, and its calls, shown as `message.tool_calls` with their arguments an object.

Tested in tests/e2e/test_ollama_api.py.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
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
from localserve.serve.admission import BuildPrompt, Frontdoor, Refusal, Request
from localserve.serve.ollama import errors
from localserve.serve.ollama.validation import public_name
from localserve.serve.tool_use import NO_TOOLS, ReplyReading, ToolUse

log = logging.getLogger("localserve.serve.ollama.reply")

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
        admitted = await door.submit(
            reply,
            user,
            client_id,
            f"{num}:{client_id}",
            fields,
            prompt,
            response_format,
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


class OllamaReply:
    """One request's reply: the sink of its engine events and the ASGI response that sends it.

    Streaming, text is written as it comes; text that arrives while a write is blocked is
    coalesced into the next line, and a client that lets max_outbox_bytes pile up, or takes
    nothing for write_timeout_s, is cut off and its request cancelled.
    """

    api = "ollama"  # in the usage record

    def __init__(
        self, door: Frontdoor, scope, kind: str, stream: bool, client_id: str, user: str,
        use: ToolUse,
    ) -> None:  # fmt: skip
        self.door = door
        self.scope = scope
        self.kind = kind
        self.stream = stream
        self.client_id = client_id
        self.user = user
        self.use = use
        self.model = public_name(door)  # as the request named it
        self.started = time.monotonic()
        self.request: Request | None = None
        self.is_closed = False
        self.pending: list[str] = []
        self.num_pending_bytes = 0
        self.done: Done | None = None
        self._ready = asyncio.Event()

    @functools.cached_property
    def reading(self) -> ReplyReading | None:
        """The reply's reading (made at its first text: the prompt it continues is known)."""
        if self.request is None:
            return None
        return self.use.reading(self.door, self.request.prompt_tail)

    # the sink: called by the server with the engine's events

    def on_token(self, request: Request, text: str) -> None:
        self.pending.append(text)
        self.num_pending_bytes += len(text.encode())
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
        done = None
        while not self.is_closed and done is None:
            text, done = await self._next()
            parts.append(text)
        if self.is_closed or done is None:
            return
        if done.finish_reason in ("error", "cancelled"):
            error = errors.failed(done, self.door.is_shutting_down)
            return await error.response()(self.scope, _no_receive, send)
        content, thinking, calls = self._read("".join(parts), True)
        body = self._object(content, thinking, calls) | self._done_fields(done)
        response = Response(_encoder.encode(body), media_type="application/json")
        await response(self.scope, _no_receive, send)

    async def _send_stream(self, send) -> None:
        headers = [(b"content-type", b"application/x-ndjson"), (b"cache-control", b"no-cache"),
                   (b"x-accel-buffering", b"no")]  # fmt: skip
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        done = None
        while done is None and not self.is_closed:
            text, done = await self._next()
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
        request = self.request
        if self.door.records_usage and request is not None and not request.is_recorded:
            out["recorded"] = False
        return out

    async def _write(self, send, obj: dict) -> None:
        data = _encoder.encode(obj) + b"\n"
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


def _arguments(text: str) -> Any:
    """A call's arguments as Ollama sends them: the JSON object (the text if it is not one)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


async def _no_receive():
    return {"type": "http.disconnect"}
