"""The Ollama API's model management, for the operator: `POST /api/pull`.

`ollama pull` and Open WebUI's model manager pull a model by name; here the name is a Hugging
Face Hub one, as Ollama's own `hf.co/ORG/REPO:QUANT` (or anything `localserve pull` takes:
ORG/REPO, ORG/REPO:QUANT, ORG/REPO/FILE.gguf, a Hub address). The pull is `localserve pull`'s
(serve/pulling.py): the file that fits this machine fetched and checked, its entry appended to
the server's models.toml under the name `localserve pull` gives it (or `name`, localserve's
extension), and the model served at once. Progress streams as Ollama's objects (NDJSON; whole,
the last one, with `"stream": false`); a failure ends the stream with `{"error": ...}`.

A pull changes what everyone is served and fills the disk: it needs the operator's credential,
the monitor token as `Authorization: Bearer` (a server with no users and no monitor token, on
loopback, lets anyone, as it does /metrics). A user's token is a 403 that says so; a wrong
token a 401, throttled like every token check. `/api/delete`, `/api/copy`, `/api/create` and
`/api/push` are not served (404): models.toml is the operator's to edit.

Tested in tests/e2e/test_ollama_pull.py; on a fake Frontdoor in tests/unit/serve/ollama/.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request as HttpRequest
from starlette.responses import Response, StreamingResponse

from localserve.serve.door import Frontdoor
from localserve.serve.ollama.errors import OllamaError, retry_after
from localserve.serve.ollama.types import PullRequest
from localserve.serve.ollama.validation import read_body
from localserve.serve.transport import bearer_token, client_address

_encoder = msgspec.json.Encoder()
MAX_SPEC_CHARS = 512
MAX_NAME_CHARS = 64


async def pull(door: Frontdoor, request: HttpRequest) -> Response:
    await _operator(door, request)
    body = await read_body(door, request, PullRequest)
    spec = body.model or body.name
    if not spec or len(spec) > MAX_SPEC_CHARS:
        raise OllamaError(400, f"model: the model to pull is required (at most {MAX_SPEC_CHARS})")
    if body.as_name is not None and not 0 < len(body.as_name) <= MAX_NAME_CHARS:
        raise OllamaError(400, f"localserve_name: 1 to {MAX_NAME_CHARS} characters")
    progress = door.pull(spec, body.as_name)
    if body.stream is not False:

        async def lines():
            async for event in progress:
                yield _encoder.encode(event) + b"\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")
    last = None
    async for event in progress:
        last = event
    if last is None or "error" in last:
        raise OllamaError(500, (last or {}).get("error", "the pull ended"))
    return Response(_encoder.encode(last), media_type="application/json")


async def _operator(door: Frontdoor, request: HttpRequest) -> None:
    """The monitor token, or a 401 (403 for a user's token: the wrong kind of credential)."""
    access, token = door.access, bearer_token(request)
    allowed = access.allows_monitor(token)
    refused = await door.authenticate(
        client_address(request.scope), "monitor", token, allowed, "pull needs the monitor token"
    )
    if refused is None:
        return
    if refused.retry_after_s:
        raise OllamaError(429, refused.message, retry_after(refused.retry_after_s))
    if token and access.user_for_token(token) is not None:
        raise OllamaError(
            403,
            "forbidden: pulling a model is the operator's: it needs the server's monitor token "
            "(Authorization: Bearer), not a user's token",
        )
    raise OllamaError(
        401,
        "unauthorized: pulling a model needs the server's monitor token (Authorization: Bearer)",
        {"WWW-Authenticate": 'Bearer realm="localserve"'},
    )
