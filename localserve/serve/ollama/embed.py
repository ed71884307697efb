"""`POST /api/embed` and the legacy `POST /api/embeddings`: texts in, one vector each out.

/api/embed takes `input` (a string or a list of strings), `truncate` (default true: an input
over the model's max_embed_tokens is cut to them; false: refused with a 400 naming it),
`dimensions` (the vectors cut and renormalised, 1 to the model's n_embd), `keep_alive` and
`options` (no option changes an embedding: they are read and ignored); it answers `model`,
`embeddings`, `total_duration`, `load_duration` (nanoseconds) and `prompt_eval_count`. No input
(missing, "" or []) only loads the model and answers no embeddings, as Ollama does.
/api/embeddings takes `prompt` and answers `embedding`, truncated as /api/embed is; an empty
prompt answers `[]`. Vectors are L2-normalised on both (Ollama's legacy endpoint gives its
model's raw vector). Usage rows say api "embeddings".

Tested in tests/e2e/test_embeddings.py; on a fake Frontdoor in
tests/unit/serve/ollama/test_embed.py.
"""

from __future__ import annotations

import secrets

import msgspec
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from localserve.engine.events import Done
from localserve.serve.door import Frontdoor, Refusal
from localserve.serve.http_embed import EmbedReply
from localserve.serve.ollama.errors import OllamaError, failed, refused
from localserve.serve.ollama.types import EmbedRequest
from localserve.serve.ollama.validation import check_common, identify, public_name, read_body

_encoder = msgspec.json.Encoder()


async def embed(door: Frontdoor, request: HttpRequest) -> Response:
    """/api/embed."""
    user = await identify(door, request)  # before anything else is answered
    body = await read_body(door, request, EmbedRequest)
    door, keep = check_common(door, body)
    inputs = [body.input] if isinstance(body.input, str) else list(body.input or ())
    inputs = [] if inputs == [""] else inputs
    if not inputs:
        return await _loaded(door, keep, {"model": public_name(door), "embeddings": []})
    for i, text in enumerate(inputs):
        if not text:
            raise OllamaError(400, f"input[{i}]: an empty string has nothing to embed")

    def reply_body(vectors: list[list[float]], done: Done) -> dict:
        timings = done.timings
        return {
            "model": public_name(door),
            "embeddings": vectors,
            "total_duration": _ns(timings.get("e2e_ms")),
            "load_duration": _ns(timings.get("load_ms")),
            "prompt_eval_count": done.prompt_tokens,
        }

    truncate = body.truncate is not False
    return await _reply(door, request, user, body, inputs, truncate, reply_body, keep)


async def embeddings(door: Frontdoor, request: HttpRequest) -> Response:
    """/api/embeddings (legacy): one `prompt`, one `embedding`."""
    user = await identify(door, request)
    body = await read_body(door, request, EmbedRequest)
    door, keep = check_common(door, body)
    if not body.prompt:
        return await _loaded(door, keep, {"embedding": []})

    def reply_body(vectors: list[list[float]], done: Done) -> dict:
        return {"embedding": vectors[0]}

    return await _reply(door, request, user, body, [body.prompt], True, reply_body, keep)


async def _reply(
    door: Frontdoor, request: HttpRequest, user, body, inputs, truncate, reply_body, keep
) -> Response:
    if body.dimensions is not None and body.dimensions < 1:
        raise OllamaError(400, f"dimensions: {body.dimensions} is not a positive number")
    num = door.next_number()
    client_id = f"embed-{num}{secrets.token_hex(4)}"

    def error(done: Done) -> Response:
        return failed(done, door.is_shutting_down).response()

    reply = EmbedReply(door, request.scope, client_id, user, reply_body, error)
    try:
        admitted = await reply.embed(
            request.receive, num, inputs, truncate, dimensions=body.dimensions, keep_alive_s=keep
        )
    except Refusal as e:
        raise refused(e) from None
    if admitted is None:  # the client left while it was admitted
        return Response(status_code=499)
    reply.request = admitted
    return reply


async def _loaded(door: Frontdoor, keep, body: dict) -> Response:
    """No input: the model loaded (a warm-up, as Ollama clients send), nothing embedded."""
    try:
        await door.warm(keep)
    except Refusal as e:
        raise OllamaError(503, e.message) from None
    return Response(_encoder.encode(body), media_type="application/json")


def _ns(ms: float | None) -> int:
    return int((ms or 0.0) * 1e6)
