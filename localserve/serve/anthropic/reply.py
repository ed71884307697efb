"""One Anthropic reply: admitted like any chat, then streamed as Anthropic's server-sent events
or sent whole.

`start_reply` passes the request to admission (`Frontdoor.submit`: the same users, limits,
fairness, quotas and usage rows as every request; `api` "anthropic" in the usage record) with
an `AnthropicReply` as its sink, which is the ASGI response too. The client's connection is
watched either way: a client that goes away, or stops reading, cancels its request at the
next step and its cells are freed.

A stream is `message_start` (the message's shell, its usage so far), each block's
`content_block_start` / `content_block_delta`s / `content_block_stop` (blocks.py),
`message_delta` (stop_reason, stop_sequence, the usage) and `message_stop`; a reply that
fails after the stream began ends with an `error` event. Usage follows Anthropic's split:
`input_tokens` are the prompt's tokens computed for this reply, `cache_read_input_tokens`
those reused from the prefix cache (the two add up to the prompt); message_start, sent before
the cache is known, counts the whole prompt as input and message_delta corrects it.

Tested in tests/e2e/test_anthropic_api.py; on a fake Frontdoor in tests/unit/serve/anthropic/.
"""

from __future__ import annotations

import secrets

import msgspec
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from localserve.chat.messages import PromptMessage
from localserve.chat.tool_calls import ContentDelta
from localserve.engine.events import Done
from localserve.protocol.frames import SamplingFields
from localserve.serve.anthropic import errors
from localserve.serve.anthropic.blocks import Blocks
from localserve.serve.door import Frontdoor, Refusal
from localserve.serve.http_reply import HttpReply, no_receive
from localserve.serve.prompt import Prompt, PromptBuilder
from localserve.serve.tool_use import ToolUse

_encoder = msgspec.json.Encoder()


async def start_reply(
    door: Frontdoor,
    request: HttpRequest,
    user: str,
    model: str,
    stream: bool,
    fields: SamplingFields,
    messages: list[PromptMessage],
    use: ToolUse,
) -> Response:
    """Admit the chat; its reply, or the refusal's error."""
    num = door.next_number()
    client_id = f"msg_{num}{secrets.token_hex(8)}"
    reply = AnthropicReply(door, request.scope, stream, client_id, user, use)
    reply.model, reply.stop_sequences = model, tuple(fields.stop)

    async def build(prompts: PromptBuilder, reply_tokens: int | None) -> Prompt:
        built = await prompts.chat(messages, reply_tokens, use.extras)
        reply.input_tokens = len(built.tokens)  # for message_start, before the engine's count
        return built

    try:
        admitted = await reply.submit(
            request.receive, num, fields, build, constraint=use.constraint
        )
    except Refusal as e:
        raise errors.refused(e) from None
    if admitted is None:  # the client left while its prompt was built
        return Response(status_code=499)
    reply.request = admitted
    return reply


class AnthropicReply(HttpReply):
    """One request's reply (serve/http_reply.py: the sink and its delivery), as Anthropic's
    server-sent events or one message."""

    api = "anthropic"  # in the usage record

    def __init__(
        self, door: Frontdoor, scope, stream: bool, client_id: str, user: str, use: ToolUse
    ) -> None:
        super().__init__(door, scope, stream, client_id, user)
        self.use = use
        self.model = door.model_name  # as the request named it
        self.stop_sequences: tuple[str, ...] = ()
        self.input_tokens = 0  # the prompt's, once built
        self.blocks = Blocks()

    def _events(self, text: str, is_last: bool) -> list[dict]:
        """The block events this piece of text settles (the last: what was held, the stop)."""
        reading = self.reading
        if reading is None:
            events = [ContentDelta(text)]
        else:
            events = reading.feed(text)
            if is_last:
                events += reading.finish()[0]
        out = self.blocks.feed(events)
        return out + self.blocks.close() if is_last else out

    async def _send_whole(self, send) -> None:
        text, done = await self._whole()
        if done is None:
            return
        if done.finish_reason in ("error", "cancelled"):
            error = errors.failed(done, self.door.is_shutting_down)
            return await error.response()(self.scope, no_receive, send)
        self._events(text, True)
        body = self._shell(self.blocks.content) | self._stop(done)
        body["usage"] = self._usage(done)
        response = Response(_encoder.encode(self._unrecorded(body)), media_type="application/json")
        await response(self.scope, no_receive, send)

    async def _send_stream(self, send) -> None:
        await self._start_stream(send)
        shell = self._shell([]) | {"stop_reason": None, "stop_sequence": None}
        shell["usage"] = {"input_tokens": self.input_tokens, "cache_creation_input_tokens": 0,
                          "cache_read_input_tokens": 0, "output_tokens": 0}  # fmt: skip
        await self._write(send, {"type": "message_start", "message": shell})
        done = None
        while done is None and not self.is_closed:
            text, done = await self._next()
            await self._send_queue_note(send)
            if done is not None and done.finish_reason in ("error", "cancelled"):
                break
            for event in self._events(text, done is not None):
                await self._write(send, event)
        if self.is_closed or done is None:
            return
        if done.finish_reason in ("error", "cancelled"):
            await self._write(send, errors.failed(done, self.door.is_shutting_down).body())
        else:
            usage = self._usage(done)
            delta = {"type": "message_delta", "delta": self._stop(done), "usage": usage}
            await self._write(send, self._unrecorded(delta))
            await self._write(send, {"type": "message_stop"})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _shell(self, content: list[dict]) -> dict:
        return {"id": self.client_id, "type": "message", "role": "assistant",
                "model": self.model, "content": content}  # fmt: skip

    def _stop(self, done: Done) -> dict:
        """Why the reply ended, as Anthropic says it."""
        reading = self.reading
        if reading is not None and reading.num_calls:
            return {"stop_reason": "tool_use", "stop_sequence": None}
        if done.finish_reason == "length":
            return {"stop_reason": "max_tokens", "stop_sequence": None}
        if done.stop and done.stop in self.stop_sequences:
            return {"stop_reason": "stop_sequence", "stop_sequence": done.stop}
        return {"stop_reason": "end_turn", "stop_sequence": None}

    def _usage(self, done: Done) -> dict:
        cached = min(done.cached_tokens, done.prompt_tokens)
        return {
            "input_tokens": done.prompt_tokens - cached,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": done.completion_tokens,
        }

    async def _write(self, send, event: dict) -> None:
        data = b"event: %s\ndata: %s\n\n" % (event["type"].encode(), _encoder.encode(event))
        await send({"type": "http.response.body", "body": data, "more_body": True})
