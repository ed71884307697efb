"""The Ollama API on the server's port, under `/api`: version, tags, show, ps, chat, generate,
embed (and the legacy embeddings), pull (the operator's), for the apps that speak only Ollama's
API (Home Assistant, phone apps, editor plugins, the `ollama` packages).

Every chat passes the same admission as any other request (through the `Frontdoor`): the same
users (a bearer token's), limits, fairness, quotas and usage rows (api "ollama"; "embeddings"
for embeddings). Errors have
Ollama's shape, `{"error": "..."}`. One module per noun:

- `types.py`: the request bodies, as msgspec decodes them.
- `errors.py`: the errors, `{"error": "..."}` with Ollama's statuses.
- `validation.py`: the checks and mappings before admission (`options`, `format`, `think`).
- `chat.py`: the chat and generate endpoints.
- `embed.py`: the embedding endpoints (/api/embed, the legacy /api/embeddings).
- `models.py`: the model endpoints (version, tags, show, ps).
- `manage.py`: pulling a model, for the operator (/api/pull).
- `reply.py`: the reply, streamed as NDJSON or sent whole.

Tested in tests/e2e/test_ollama_api.py; on a fake Frontdoor in tests/unit/serve/ollama/.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import Response
from starlette.routing import Route

from localserve.serve.door import Frontdoor
from localserve.serve.ollama.chat import chat, generate
from localserve.serve.ollama.embed import embed, embeddings
from localserve.serve.ollama.errors import OllamaError
from localserve.serve.ollama.manage import pull
from localserve.serve.ollama.models import OllamaModels

PREFIX = "/api"

Endpoint = Callable[[Frontdoor, HttpRequest], Awaitable[Response]]
Handler = Callable[[HttpRequest, Exception], Awaitable[Response]]


def routes(door: Frontdoor) -> list[Route]:
    """The API's routes, every one answering through `door`."""
    models = OllamaModels(door)
    return [
        Route(f"{PREFIX}/version", models.version, methods=["GET", "HEAD"]),
        Route(f"{PREFIX}/tags", models.tags, methods=["GET", "HEAD"]),
        Route(f"{PREFIX}/ps", models.ps, methods=["GET"]),
        Route(f"{PREFIX}/show", models.show, methods=["POST"]),
        Route(f"{PREFIX}/embed", _bound(embed, door), methods=["POST"]),
        Route(f"{PREFIX}/embeddings", _bound(embeddings, door), methods=["POST"]),
        Route(f"{PREFIX}/chat", _bound(chat, door), methods=["POST"]),
        Route(f"{PREFIX}/generate", _bound(generate, door), methods=["POST"]),
        Route(f"{PREFIX}/pull", _bound(pull, door), methods=["POST"]),
    ]


def exception_handlers(others: dict) -> dict:
    """Starlette's own errors (unknown path, wrong method) in Ollama's shape under /api, the
    other front-ends' (`others`: their handlers) elsewhere."""
    fallback: Handler | None = others.get(HTTPException)

    async def http_error(request: HttpRequest, exc: HTTPException) -> Response:
        if not request.url.path.startswith(PREFIX + "/") and fallback is not None:
            return await fallback(request, exc)
        message = f"{request.method} {request.url.path[:100]}: {exc.detail}"
        return OllamaError(exc.status_code, message, exc.headers).response()

    async def ollama_error(request: HttpRequest, exc: OllamaError) -> Response:
        return exc.response()

    return others | {HTTPException: http_error, OllamaError: ollama_error}


def _bound(endpoint: Endpoint, door: Frontdoor) -> Callable[[HttpRequest], Awaitable[Response]]:
    async def handle(request: HttpRequest) -> Response:
        return await endpoint(door, request)

    return handle
