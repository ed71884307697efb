"""An HTTP API request's JSON body, read as every front-end must read what a client sends:
bounded in bytes (the declared length and what arrives) and in time, then decoded into the
endpoint's msgspec type.

`read_json` raises `BodyProblem` (a status, a short code and a message that quotes little of
the body); each front-end (serve/openai, serve/ollama, serve/anthropic) turns it into an error
of its own shape.

Tested in tests/e2e/test_openai_api.py, tests/e2e/test_ollama_api.py and
tests/e2e/test_anthropic_api.py (and their hostile bodies in tests/e2e/test_hostile_clients.py).
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

import msgspec
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest

BODY_TIMEOUT_S = 30.0  # a request body must arrive within this long

Body = TypeVar("Body")


class BodyProblem(Exception):
    """Why a body was not read: `status` (400, 408, 413), `code` (request_too_large, timeout,
    gone, missing, invalid_value, invalid_json), `message`; `invalid` is msgspec's error for
    a body of the wrong shape (it names the field)."""

    def __init__(
        self, status: int, code: str, message: str, invalid: msgspec.ValidationError | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.invalid = status, code, message, invalid


async def read_json(
    request: HttpRequest, limit: int, kind: type[Body], timeout_s: float = BODY_TIMEOUT_S
) -> Body:
    """The request's JSON, at most `limit` bytes arriving within `timeout_s`, as `kind`."""
    too_large = BodyProblem(413, "request_too_large", f"request body over {limit} bytes")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise too_large
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)
    except TimeoutError:
        message = f"request body not received within {timeout_s:g} s"
        raise BodyProblem(408, "timeout", message) from None
    except ClientDisconnect:
        raise BodyProblem(400, "gone", "the client left before its body arrived") from None
    data = b"".join(chunks)
    if not data.strip():
        raise BodyProblem(400, "missing", "missing request body")
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as e:
        raise BodyProblem(400, "invalid_value", f"invalid request: {e}", e) from None
    except (msgspec.DecodeError, RecursionError) as e:
        raise BodyProblem(400, "invalid_json", f"invalid JSON body: {e}") from None
