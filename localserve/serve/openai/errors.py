"""The OpenAI API's errors: `{"error": {"message", "type", "code", "param"}}` with a status, so
clients raise the matching exception.

Admission's refusals (docs/protocol.md's codes) map to 400, 429 and 503; a reply the engine
failed or a shutdown cut short is a 500 or a 503. Every 429 and 503 carries Retry-After.

Tested in tests/e2e/test_openai_api.py; on a fake Frontdoor in tests/unit/serve/openai/.
"""

from __future__ import annotations

import math

import msgspec
from starlette.responses import Response

from localserve.engine.events import Done
from localserve.serve.door import MAX_ERROR_CHARS, RETRY_UNAVAILABLE_S, Refusal

CHALLENGE = {"WWW-Authenticate": 'Bearer realm="localserve"'}

_encoder = msgspec.json.Encoder()

# from the admission's codes (docs/protocol.md) to HTTP
_REFUSALS = {
    "bad_request": (400, "invalid_request_error", "invalid_value"),
    "too_long": (400, "invalid_request_error", "context_length_exceeded"),
    "busy": (429, "rate_limit_error", "rate_limit_exceeded"),
    "quota_exceeded": (429, "insufficient_quota", "insufficient_quota"),
    "shutting_down": (503, "server_error", "shutting_down"),
    "unavailable": (503, "server_error", "engine_unavailable"),
}


class ApiError(Exception):
    """An error in OpenAI's shape, with its HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        # like websocket error frames, never more than a little of what the client sent
        if len(message) > MAX_ERROR_CHARS:
            message = message[:MAX_ERROR_CHARS] + "…"
        param = param[:MAX_ERROR_CHARS] if param else param
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.kind, self.headers = kind, headers or {}

    def response(self) -> Response:
        body = {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }
        return Response(_encoder.encode(body), self.status, self.headers, "application/json")


def unsupported(param: str, what: str) -> ApiError:
    return ApiError(400, f"{param}: {what} is not supported by localserve", "unsupported", param)


def retry_after(seconds: float) -> dict[str, str]:
    """The header every 429 and 503 carries (at least 1 s: some clients read 0 as at once)."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def refused(refusal: Refusal, kind: str) -> ApiError:
    """Admission's refusal of a chat ("chat"), text completion ("text") or embedding request
    ("embeddings") as an HTTP error."""
    status, error_type, code = _REFUSALS.get(refusal.code, (500, "server_error", refusal.code))
    headers = retry_after(refusal.retry_after_s) if status in (429, 503) else None
    param = None
    if refusal.code == "too_long":  # an embedding's names its input (`input[3]: ...`)
        param = {"chat": "messages", "text": "prompt"}.get(kind) or _param_of(refusal.message)
    if refusal.code == "bad_request":
        param = _param_of(refusal.message)
    return ApiError(status, refusal.message, code, param, error_type, headers)


def failed(done: Done, is_shutting_down: bool) -> ApiError:
    """A reply that ended without its text: cancelled (a shutdown), or failed in the engine."""
    if done.finish_reason == "cancelled":
        if is_shutting_down:
            message = "the server shut down before the reply was done"
            return ApiError(503, message, "shutting_down", None, "server_error", retry_after(0))
        return ApiError(500, "the request was cancelled", "cancelled", kind="server_error")
    if done.error_code == "unavailable":  # the engine process stopped under it
        wait = retry_after(RETRY_UNAVAILABLE_S)
        return ApiError(503, done.error[:300], "engine_unavailable", None, "server_error", wait)
    return ApiError(
        500,
        f"the engine failed this request: {done.error or 'error'}"[:300],
        "internal_error",
        kind="server_error",
    )


def _param_of(message: str) -> str | None:
    """The field an admission message starts with (`temperature: must be ...`, or a path such
    as `response_format.json_schema.schema: ...`)."""
    head, sep, _ = message.partition(":")
    bare = head.translate(str.maketrans("", "", "_.$[]"))
    return head if sep and bare.isalnum() else None
