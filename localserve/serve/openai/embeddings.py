"""`POST /v1/embeddings`: texts or token arrays in, one vector each out.

`input` is a string, a list of strings, a list of token ids or a list of token id lists
(one kind in one request; ids checked against the model's vocabulary by admission); an input
over the model's max_embed_tokens is refused with a 400 naming it, its tokens and the bound
(OpenAI refuses too, where Ollama cuts), a list past the count bound with a 400 naming its
count. `encoding_format` "float" (the default) or "base64" (little-endian float32, as the
openai package decodes it: the package asks for it by default); `dimensions` cuts the vectors
and renormalises them (1 to the model's n_embd, else a 400); `user` names the user on an open
server, as for chats. Vectors are L2-normalised. Usage rows say api "embeddings".

Tested in tests/e2e/test_embeddings.py; on a fake Frontdoor in
tests/unit/serve/openai/test_embeddings.py.
"""

from __future__ import annotations

import base64
import secrets

import numpy
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from localserve.engine.events import Done
from localserve.serve.door import MAX_EMBED_INPUTS, Frontdoor, Refusal
from localserve.serve.http_embed import EmbedReply
from localserve.serve.openai import errors
from localserve.serve.openai.errors import ApiError
from localserve.serve.openai.types import EmbeddingsBody
from localserve.serve.openai.validation import identify, read_body

ENCODINGS = ("float", "base64")
KINDS = "a string, a list of strings, a list of token ids or a list of token id lists"


async def create_embedding(door: Frontdoor, request: HttpRequest) -> Response:
    body = await read_body(door, request, EmbeddingsBody)
    door = door.model(body.model)  # checked by read_body: one of the server's
    encoding = body.encoding_format or "float"
    if encoding not in ENCODINGS:
        message = f"encoding_format: {encoding[:40]!r} is not one of float, base64"
        raise ApiError(400, message, "invalid_value", "encoding_format")
    if body.dimensions is not None and body.dimensions < 1:
        message = f"dimensions: {body.dimensions} is not a positive number"
        raise ApiError(400, message, "invalid_value", "dimensions")
    inputs = read_inputs(body.input)
    user = await identify(door, request, body.user)
    num = door.next_number()
    client_id = f"embd-{num}{secrets.token_hex(4)}"
    model = door.model_name

    def reply_body(vectors: list[list[float]], done: Done) -> dict:
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": _encoded(v, encoding)}
                for i, v in enumerate(vectors)
            ],
            "model": model,
            "usage": {"prompt_tokens": done.prompt_tokens, "total_tokens": done.prompt_tokens},
        }

    def failed(done: Done) -> Response:
        return errors.failed(done, door.is_shutting_down).response()

    reply = EmbedReply(door, request.scope, client_id, user, reply_body, failed)
    try:
        dimensions = body.dimensions
        admitted = await reply.embed(request.receive, num, inputs, False, dimensions=dimensions)
    except Refusal as e:
        raise errors.refused(e, "embeddings") from None
    if admitted is None:  # the client left while it was admitted
        return Response(status_code=499)
    reply.request = admitted
    return reply


def read_inputs(raw: str | list) -> list[str] | list[list[int]]:
    """`input` as a list of texts or of token id lists; a 400 naming what is wrong."""
    if isinstance(raw, str):
        raw = [raw]
    if not raw:
        raise _invalid("input", "input: at least one input is needed")
    if all(_is_id(x) for x in raw):  # one token array
        return [raw]
    if len(raw) > MAX_EMBED_INPUTS:  # before each is looked at
        raise _invalid(
            "input",
            f"input: {len(raw)} inputs; at most {MAX_EMBED_INPUTS} in one request (send them "
            f"in several)",
        )
    if isinstance(raw[0], str):
        for i, text in enumerate(raw):
            if not isinstance(text, str):
                raise _invalid("input", f"input[{i}]: {_kind(text)} in a list of strings")
            if not text:
                raise _invalid(f"input[{i}]", f"input[{i}]: an empty string has nothing to embed")
        return raw
    for i, tokens in enumerate(raw):
        if not isinstance(tokens, list) or not all(_is_id(t) for t in tokens):
            raise _invalid("input", f"input: {KINDS}; input[{i}] is {_kind(tokens)}")
    return raw


def _is_id(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _kind(x) -> str:
    if isinstance(x, list):
        return "a list that is not all token ids"
    return {str: "a string", bool: "a boolean", int: "a number", float: "a number",
            dict: "an object", type(None): "null"}.get(type(x), "a value")  # fmt: skip


def _invalid(param: str, message: str) -> ApiError:
    return ApiError(400, message, "invalid_value", param)


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    """The vector as floats, or as base64 of its little-endian float32 bytes."""
    if encoding == "float":
        return vector
    return base64.b64encode(numpy.asarray(vector, dtype="<f4").tobytes()).decode()
