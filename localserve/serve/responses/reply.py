"""One Responses API reply: the response object, whole or as its stream of events, stored before
it says it is done.

`ResponseReply` is the request's sink and its ASGI response (serve/http_reply.py: the client
watched, text coalesced, a client gone or not reading cancels the request); `api` "responses"
names it in the usage record. Its text is read as the request asked (serve/tool_use.py's
reading: reasoning, calls) into output items (output.py). A stream is server-sent events, each
`event: <type>` and its `data:`: response.created and response.in_progress, the items' events,
then response.completed (response.incomplete when max_output_tokens cut it short, with
`incomplete_details.reason` "max_output_tokens"), or response.failed when the engine failed it.
A response kept (`store`) is committed to the store before that last event (or the whole body)
goes out, so a follow-up sent at once finds it.

Tested in tests/unit/serve/responses/test_create.py and tests/e2e/test_responses_api.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
from starlette.responses import Response

from localserve.chat.messages import PromptMessage
from localserve.chat.tool_calls import ContentDelta
from localserve.engine.events import Done
from localserve.serve.door import Frontdoor
from localserve.serve.http_reply import HttpReply, no_receive
from localserve.serve.openai import errors
from localserve.serve.responses.items import output_turns
from localserve.serve.responses.output import Output
from localserve.serve.tool_use import ToolUse

log = logging.getLogger("localserve.serve.responses")

_encoder = msgspec.json.Encoder()

# the response kept (its object, the turns it adds to its chain): False when it was not
Keep = Callable[[dict, list[PromptMessage]], Awaitable[bool]]


class ResponseReply(HttpReply):
    """A response's sink and ASGI reply; `envelope` is the response object without its output
    (the request's fields echoed), `keep` stores it (None: store false)."""

    api = "responses"  # in the usage record

    def __init__(
        self,
        door: Frontdoor,
        scope,
        stream: bool,
        envelope: dict,
        user: str,
        use: ToolUse,
        keep: Keep | None,
    ) -> None:
        super().__init__(door, scope, stream, envelope["id"], user)
        self.envelope = envelope
        self.use = use
        self.keep = keep
        self.output = Output()

    def _size(self, text: str) -> int:
        return len(_encoder.encode(text))  # as it will be sent: JSON-escaped

    def _read(self, text: str, is_last: bool) -> list:
        """The reply's events (content, reasoning, calls) this text settles."""
        reading = self.reading
        if reading is None:
            return [ContentDelta(text)] if text else []
        events = reading.feed(text)
        return events + reading.finish()[0] if is_last else events

    def response(self, status: str, done: Done | None = None, error: dict | None = None) -> dict:
        """The response object as it is now."""
        body = {**self.envelope, "status": status, "output": list(self.output.items)}
        if status == "incomplete":
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        if done is not None and status in ("completed", "incomplete"):
            body["usage"] = usage(done)
        body["error"] = error
        return body

    async def _finished(self, done: Done) -> dict:
        """The final response object, kept first when asked."""
        status = "incomplete" if done.finish_reason == "length" else "completed"
        body = self.response(status, done)
        if self.keep is not None:
            turns = output_turns(self.output.content, self.output.calls)
            body["store"] = await self.keep(body, turns)
        return self._unrecorded(body)

    # --- whole ---

    async def _send_whole(self, send) -> None:
        text, done = await self._whole()
        if done is None:
            return
        if done.finish_reason in ("error", "cancelled"):
            error = errors.failed(done, self.door.is_shutting_down)
            return await error.response()(self.scope, no_receive, send)
        self.output.feed(self._read(text, True))
        self.output.finish("incomplete" if done.finish_reason == "length" else "completed")
        body = await self._finished(done)
        response = Response(_encoder.encode(body), media_type="application/json")
        await response(self.scope, no_receive, send)

    # --- streamed ---

    async def _send_stream(self, send) -> None:
        await self._start_stream(send)
        out = self.output
        created = self.response("in_progress")
        await self._write(send, [out.event("response.created", response=created),
                                 out.event("response.in_progress", response=created)])  # fmt: skip
        done = None
        while done is None and not self.is_closed:
            text, done = await self._next()
            await self._send_queue_note(send)
            await self._write(send, out.feed(self._read(text, done is not None)))
        if self.is_closed or done is None:
            return
        await self._write(send, await self._last_events(done))
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _last_events(self, done: Done) -> list[dict]:
        out = self.output
        if done.finish_reason in ("error", "cancelled"):
            failure = errors.failed(done, self.door.is_shutting_down)
            error = {"code": "server_error", "message": failure.message}
            return out.finish("incomplete") + [
                out.event("response.failed", response=self.response("failed", error=error))
            ]
        events = out.finish("incomplete" if done.finish_reason == "length" else "completed")
        body = await self._finished(done)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return events + [out.event(kind, response=body)]

    async def _write(self, send, events: list[dict]) -> None:
        if not events:
            return
        data = b"".join(
            b"event: %s\ndata: %s\n\n" % (e["type"].encode(), _encoder.encode(e)) for e in events
        )
        await send({"type": "http.response.body", "body": data, "more_body": True})


def usage(done: Done) -> dict:
    """The Responses API's usage: the prompt's tokens (those from the cache among them) and
    the reply's."""
    return {
        "input_tokens": done.prompt_tokens,
        "input_tokens_details": {"cached_tokens": done.cached_tokens},
        "output_tokens": done.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }


def envelope(
    id: str, model: str, body, fields, tools: list[dict] | None, previous: str | None, store: bool
) -> dict:
    """The response object's fields that echo the request (a ResponsesRequest, its sampling
    fields), as OpenAI's response has them."""
    return {
        "id": id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "model": model,
        "output": [],
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": previous,
        "reasoning": {"effort": None, "summary": None},
        "store": store,
        "temperature": fields.temperature,
        "text": {"format": (body.text or {}).get("format") or {"type": "text"}},
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": tools or [],
        "top_p": fields.top_p,
        "truncation": body.truncation or "disabled",
        "usage": None,
        "user": body.user,
    }
