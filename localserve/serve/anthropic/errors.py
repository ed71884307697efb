"""The Anthropic API's errors: `{"type": "error", "error": {"type", "message"}}` with the
status Anthropic gives, so its clients raise the matching exception.

Admission's refusals (docs/protocol.md's codes) map to 400 (a bad or too-long request), 429
(busy, over the quota) and 529 (overloaded: the server shutting down, the engine process
down); a reply the engine failed is a 500. Every 429 and 529 carries Retry-After. An error
after a stream began is its `error` event, with the same body. A message names the field as
Anthropic does, a dotted path (`messages.1.content.0.tool_use_id: ...`): `dotted` turns
msgspec's `$.messages[1].content` into that, `named_as_anthropic` the tool errors that
serve/tool_use.py words in OpenAI's fields (it checks tools as OpenAI's) into Anthropic's.

Tested in tests/e2e/test_anthropic_api.py; on a fake Frontdoor in tests/unit/serve/anthropic/.
"""

from __future__ import annotations

import math
import re

import msgspec
from starlette.responses import Response

from localserve.engine.events import Done
from localserve.serve.door import MAX_ERROR_CHARS, RETRY_UNAVAILABLE_S, Refusal

OVERLOADED = 529  # Anthropic's status for "try again later"

# the error's type for each status (Anthropic's list: docs.anthropic.com's "Errors")
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    OVERLOADED: "overloaded_error",
}

_REFUSALS = {
    "bad_request": 400,
    "too_long": 400,
    "busy": 429,
    "quota_exceeded": 429,
    "shutting_down": OVERLOADED,
    "unavailable": OVERLOADED,
}

_encoder = msgspec.json.Encoder()


class AnthropicError(Exception):
    """An error in Anthropic's shape, with its HTTP status."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        if len(message) > MAX_ERROR_CHARS:  # never more than a little of what the client sent
            message = message[:MAX_ERROR_CHARS] + "…"
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}

    @property
    def kind(self) -> str:
        return TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "api_error")

    def body(self) -> dict:
        return {"type": "error", "error": {"type": self.kind, "message": self.message}}

    def response(self) -> Response:
        return Response(_encoder.encode(self.body()), self.status, self.headers, "application/json")


def invalid(param: str, why: str) -> AnthropicError:
    return AnthropicError(400, f"{param}: {why}")


def unsupported(param: str, what: str) -> AnthropicError:
    return AnthropicError(400, f"{param}: {what} is not supported by localserve")


def dotted(path: str) -> str:
    """`messages[1].content[0]` as Anthropic writes it: `messages.1.content.0`."""
    return re.sub(r"\[(\d+)\]", r".\1", path)


# OpenAI's fields in a tool error (chat/tools.py) and Anthropic's for them, in this order
_OPENAI_FIELDS = (
    (r"\b(tools\[\d+\])\.function\.parameters\b", r"\1.input_schema"),
    (r"\b(tools\[\d+\]|tool_choice)\.function\b", r"\1"),  # .name, .description
    (r"'required' needs tools", "'any' needs tools"),
    (r"(cannot be written: [\w.\-]+?)\.parameters\b", r"\1.input_schema"),  # a tool's schema
)


def named_as_anthropic(message: str) -> str:
    """A tool error worded in OpenAI's fields in Anthropic's: tools.0.input_schema for
    tools[0].function.parameters, tool_choice.name for tool_choice.function.name."""
    for openai, anthropic in _OPENAI_FIELDS:
        message = re.sub(openai, anthropic, message)
    return dotted(message)


def retry_after(seconds: float) -> dict[str, str]:
    """At least 1 s: some clients read 0 as at once."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def refused(refusal: Refusal) -> AnthropicError:
    status = _REFUSALS.get(refusal.code, 500)
    headers = retry_after(refusal.retry_after_s) if status in (429, OVERLOADED) else None
    return AnthropicError(status, refusal.message, headers)


def failed(done: Done, is_shutting_down: bool) -> AnthropicError:
    """A reply that ended without its text: cancelled (a shutdown), or failed in the engine."""
    if done.finish_reason == "cancelled":
        if is_shutting_down:
            message = "the server shut down before the reply was done"
            return AnthropicError(OVERLOADED, message, retry_after(0))
        return AnthropicError(500, "the request was cancelled")
    if done.error_code == "unavailable":
        return AnthropicError(OVERLOADED, done.error[:300], retry_after(RETRY_UNAVAILABLE_S))
    return AnthropicError(500, f"the engine failed this request: {done.error or 'error'}"[:300])
