"""The Ollama API's errors: `{"error": "..."}` with the HTTP status Ollama gives.

Admission's refusals (docs/protocol.md's codes) map to 400, 429 and 503 as in the OpenAI API;
a reply the engine failed is a 500 (503 when the engine process or the server went away).

Tested in tests/e2e/test_ollama_api.py; on a fake Frontdoor in tests/unit/serve/ollama/.
"""

from __future__ import annotations

import math

import msgspec
from starlette.responses import Response

from localserve.engine.events import Done
from localserve.serve.door import MAX_ERROR_CHARS, RETRY_UNAVAILABLE_S, Refusal

_encoder = msgspec.json.Encoder()

_REFUSALS = {
    "bad_request": 400,
    "too_long": 400,
    "busy": 429,
    "quota_exceeded": 429,
    "shutting_down": 503,
    "unavailable": 503,
}


class OllamaError(Exception):
    """An error in Ollama's shape, with its HTTP status."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        if len(message) > MAX_ERROR_CHARS:  # never more than a little of what the client sent
            message = message[:MAX_ERROR_CHARS] + "…"
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}

    def body(self) -> dict:
        return {"error": self.message}

    def response(self) -> Response:
        return Response(_encoder.encode(self.body()), self.status, self.headers, "application/json")


def unsupported(param: str, what: str) -> OllamaError:
    return OllamaError(400, f"{param}: {what} is not supported by localserve")


def retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def refused(refusal: Refusal) -> OllamaError:
    status = _REFUSALS.get(refusal.code, 500)
    headers = retry_after(refusal.retry_after_s) if status in (429, 503) else None
    return OllamaError(status, refusal.message, headers)


def failed(done: Done, is_shutting_down: bool) -> OllamaError:
    """A reply that ended without its text: cancelled (a shutdown), or failed in the engine."""
    if done.finish_reason == "cancelled":
        if is_shutting_down:
            message = "the server shut down before the reply was done"
            return OllamaError(503, message, retry_after(0))
        return OllamaError(500, "the request was cancelled")
    if done.error_code == "unavailable":
        return OllamaError(503, done.error[:300], retry_after(RETRY_UNAVAILABLE_S))
    return OllamaError(500, f"the engine failed this request: {done.error or 'error'}"[:300])
