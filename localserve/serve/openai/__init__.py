"""The OpenAI-compatible HTTP API: `/v1/models`, `/v1/chat/completions`, `/v1/completions`,
`/v1/embeddings`.

Every request passes the same admission as a websocket chat (through the `Frontdoor`): the
same users, limits, prefix isolation and too-long check. Errors have OpenAI's shape, so clients
raise the matching exception. One module per noun:

- `types.py`: the bodies: the requests as msgspec decodes them, the replies' objects.
- `errors.py`: the errors, in OpenAI's shape and with its statuses.
- `validation.py`: the checks before admission: the body, the model, the user.
- `chat_completions.py`: `POST /v1/chat/completions`.
- `completions.py`: `POST /v1/completions` (a text prompt, no chat template).
- `embeddings.py`: `POST /v1/embeddings` (texts or token arrays; float or base64).
- `models.py`: `GET /v1/models` and `GET /v1/models/{model}`.
- `read.py`: a chat reply read as OpenAI shows it: content, reasoning, tool calls.
- `reply.py`: the reply, streamed as server-sent events or sent whole.

Tested in tests/e2e/test_openai_api.py; on a fake Frontdoor in tests/unit/serve/openai/.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import Response
from starlette.routing import Route

from localserve.serve.door import Frontdoor
from localserve.serve.openai.chat_completions import create_chat_completion
from localserve.serve.openai.completions import create_completion
from localserve.serve.openai.embeddings import create_embedding
from localserve.serve.openai.errors import ApiError
from localserve.serve.openai.models import Models

PREFIX = "/v1"

Endpoint = Callable[[Frontdoor, HttpRequest], Awaitable[Response]]


def routes(door: Frontdoor) -> list[Route]:
    """The API's routes, every one answering through `door`."""
    models = Models(door, created=int(time.time()))
    return [
        Route(f"{PREFIX}/models", models.list_models, methods=["GET"]),
        Route(f"{PREFIX}/models/{{model:path}}", models.get_model, methods=["GET"]),
        Route(f"{PREFIX}/chat/completions", _bound(create_chat_completion, door), methods=["POST"]),
        Route(f"{PREFIX}/completions", _bound(create_completion, door), methods=["POST"]),
        Route(f"{PREFIX}/embeddings", _bound(create_embedding, door), methods=["POST"]),
    ]


def exception_handlers() -> dict:
    """Starlette's own errors (unknown path, wrong method) in OpenAI's shape under /v1."""

    async def http_error(request: HttpRequest, exc: HTTPException) -> Response:
        if not request.url.path.startswith(PREFIX):
            return Response(f"{exc.detail}\n", exc.status_code, exc.headers, "text/plain")
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = f"{request.method} {request.url.path[:100]}: {exc.detail}"
        return ApiError(exc.status_code, message, code, headers=exc.headers).response()

    async def api_error(request: HttpRequest, exc: ApiError) -> Response:
        return exc.response()

    return {HTTPException: http_error, ApiError: api_error}


def _bound(endpoint: Endpoint, door: Frontdoor) -> Callable[[HttpRequest], Awaitable[Response]]:
    """The endpoint as Starlette calls it: a coroutine function of the request alone."""

    async def handle(request: HttpRequest) -> Response:
        return await endpoint(door, request)

    return handle
