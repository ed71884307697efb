"""The Anthropic Messages API on the server's port: `POST /v1/messages` and
`POST /v1/messages/count_tokens`, for Claude Code and the other agents and apps that speak
Anthropic's API (the `anthropic` packages).

Every message passes the same admission as any other request (through the `Frontdoor`): the
same users (an API key's), limits, fairness, quotas and usage rows (api "anthropic"). Errors
have Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`, under
/v1/messages (the rest of /v1 keeps OpenAI's). One module per noun:

- `types.py`: the request bodies, as msgspec decodes them.
- `errors.py`: the errors, in Anthropic's shape and with its statuses.
- `validation.py`: the checks before admission: the user, the body, the model, sampling.
- `messages.py`: the endpoints, and the mapping of messages and tools.
- `blocks.py`: the reply's content blocks, built as its text is read.
- `reply.py`: the reply, streamed as server-sent events or sent whole.

Tested in tests/e2e/test_anthropic_api.py; on a fake Frontdoor in tests/unit/serve/anthropic/.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import Response
from starlette.routing import Route

from localserve.serve.anthropic.errors import AnthropicError
from localserve.serve.anthropic.messages import TokenCounter, create_message
from localserve.serve.door import Frontdoor

PREFIX = "/v1/messages"

Handler = Callable[[HttpRequest, Exception], Awaitable[Response]]


def routes(door: Frontdoor) -> list[Route]:
    """The API's routes, every one answering through `door`."""

    async def messages(request: HttpRequest) -> Response:
        return await create_message(door, request)

    return [
        Route(PREFIX, messages, methods=["POST"]),
        Route(f"{PREFIX}/count_tokens", TokenCounter(door).count_tokens, methods=["POST"]),
    ]


def exception_handlers(others: dict) -> dict:
    """Starlette's own errors (unknown path, wrong method) in Anthropic's shape under
    /v1/messages, the other front-ends' (`others`: their handlers) elsewhere."""
    fallback: Handler | None = others.get(HTTPException)

    async def http_error(request: HttpRequest, exc: HTTPException) -> Response:
        path = request.url.path
        if not (path == PREFIX or path.startswith(PREFIX + "/")) and fallback is not None:
            return await fallback(request, exc)
        message = f"{request.method} {path[:100]}: {exc.detail}"
        return AnthropicError(exc.status_code, message, exc.headers).response()

    async def anthropic_error(request: HttpRequest, exc: AnthropicError) -> Response:
        return exc.response()

    return others | {HTTPException: http_error, AnthropicError: anthropic_error}
