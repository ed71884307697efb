"""The OpenAI API's bodies: the requests as msgspec decodes them, and the replies' JSON objects.

Request fields are None when not given (some clients send explicit nulls); unknown fields are
ignored (OpenAI clients send many). `ReplyBodies` builds one reply's objects, a chat or a text
completion, whole or as stream chunks, in OpenAI's shape.

Tested in tests/e2e/test_openai_api.py; on a fake Frontdoor in tests/unit/serve/openai/.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from localserve.engine.events import Done

# --- requests -----------------------------------------------------------------------------------


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str = "{}"  # JSON text


class ToolCall(msgspec.Struct, kw_only=True):
    """A call an assistant message made (in the history a client sends back)."""

    id: str = ""
    type: str = "function"
    function: FunctionCall


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None


class RequestFields(msgspec.Struct, kw_only=True):
    """Fields both endpoints take; None = not given (some clients send explicit nulls)."""

    model: str | None = None  # None: the server's model (as llama-server does)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: int | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    # localserve's (and llama-server's) extensions
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    ignore_eos: bool | None = None


class EmbeddingsBody(msgspec.Struct, kw_only=True):
    """/v1/embeddings' body. `input` is a string, a list of strings, a list of token ids or a
    list of token id lists (one type each: checked by the endpoint, as msgspec cannot)."""

    input: str | list[Any]
    model: str | None = None
    encoding_format: str | None = None  # "float" (None) or "base64"
    dimensions: int | None = None
    user: str | None = None


class ChatCompletionRequest(RequestFields, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's and llama-server's extension
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None


class CompletionRequest(RequestFields, kw_only=True):
    prompt: str | list[str]
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None


# --- replies ------------------------------------------------------------------------------------


class ReplyBodies:
    """The JSON objects of one reply: `kind` "chat" (a chat completion) or "text"."""

    def __init__(self, kind: str, client_id: str, model: str, include_usage: bool) -> None:
        self.kind = kind
        self.client_id = client_id
        self.model = model
        self.include_usage = include_usage
        self.created = int(time.time())
        # a chat's oldest messages left out to fit the context (set when it is admitted)
        self.dropped_messages = 0

    def whole(
        self,
        text: str,
        done: Done,
        reasoning: str = "",
        tool_calls: list[dict] | None = None,
        finish_reason: str | None = None,
    ) -> dict:
        """A reply that comes whole, with its usage (a chat: its reasoning and calls too)."""
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if reasoning:
                message["reasoning_content"] = reasoning
            if tool_calls:
                message["tool_calls"] = tool_calls
                message["content"] = text or None  # OpenAI's: no text beside the calls
            choice = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason or done.finish_reason,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": done.finish_reason,
            }
        body = self.envelope([choice], whole=True)
        body["usage"] = self.usage(done)
        return body

    def chunk(self, delta, finish_reason: str | None = None) -> dict:
        """One stream chunk; its delta a dict (chat) or the text."""
        if self.kind == "chat":
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish_reason}
        chunk = self.envelope([choice], whole=False)
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def usage_chunk(self, done: Done) -> dict:
        """The stream's last chunk when the client asked for usage: no choices, the usage."""
        chunk = self.envelope([], whole=False)
        chunk["usage"] = self.usage(done)
        return chunk

    def usage(self, done: Done) -> dict:
        """The reply's usage; a chat's also says how many of its messages were left out."""
        counts = usage(done)
        if self.kind == "chat":
            counts["dropped_messages"] = self.dropped_messages
        return counts

    def envelope(self, choices: list, whole: bool) -> dict:
        obj = (
            ("chat.completion" if whole else "chat.completion.chunk")
            if self.kind == "chat"
            else "text_completion"
        )
        return {
            "id": self.client_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }


def usage(done: Done) -> dict:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
    }
