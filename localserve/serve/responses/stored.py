"""`GET /v1/responses/{id}`, `GET /v1/responses/{id}/input_items` and `DELETE
/v1/responses/{id}`: a stored response read or deleted, by its owner only.

The person is named as for any OpenAI request (the API key's owner, a trusted front-end's
person; on an open server the `user` query parameter, else the default user); another person's
id is a 404, exactly as an id never stored. A delete answers as OpenAI's: `{"id", "object":
"response", "deleted": true}`.

Tested in tests/unit/serve/responses/test_create.py and tests/e2e/test_responses_api.py.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from localserve.ops.responses_store import ResponseStore, ResponseStoreError
from localserve.serve.door import Frontdoor
from localserve.serve.openai.errors import ApiError
from localserve.serve.openai.validation import identify
from localserve.serve.responses.create import MAX_RESPONSE_ID_CHARS, not_found, store_failed

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode


def _json(body) -> Response:
    data = body if isinstance(body, bytes) else _encode(body)
    return Response(data, media_type="application/json")


async def _owner_and_id(door: Frontdoor, store: ResponseStore | None, request: HttpRequest):
    if store is None:
        raise ApiError(404, "this server keeps no responses ([server] responses_store = false)",
                       "not_found")  # fmt: skip
    user = await identify(door, request, request.query_params.get("user"))
    id = request.path_params["id"]
    if len(id) > MAX_RESPONSE_ID_CHARS:
        raise not_found(id)
    return user, id


async def _found(door: Frontdoor, store: ResponseStore | None, request: HttpRequest):
    """The stored response the path names, the asker's own (404 for anyone else's); its id."""
    user, id = await _owner_and_id(door, store, request)
    try:
        found = await store.get(user, id)  # type: ignore[union-attr]
    except ResponseStoreError as e:
        raise store_failed(e) from None
    if found is None:
        raise not_found(id)
    return found, id


async def get_response(door: Frontdoor, store: ResponseStore | None, request: HttpRequest):
    found, _ = await _found(door, store, request)
    return _json(found.body)


async def get_input_items(door: Frontdoor, store: ResponseStore | None, request: HttpRequest):
    found, id = await _found(door, store, request)
    data = [
        {"id": f"item_{id}_{i}", **item} if isinstance(item, dict) else item
        for i, item in enumerate(_decode(found.input))
    ]
    first, last = (data[0].get("id"), data[-1].get("id")) if data else (None, None)
    return _json({"object": "list", "data": data, "first_id": first, "last_id": last,
                  "has_more": False})  # fmt: skip


async def delete_response(door: Frontdoor, store: ResponseStore | None, request: HttpRequest):
    user, id = await _owner_and_id(door, store, request)
    try:
        gone = await store.delete(user, id)  # type: ignore[union-attr]
    except ResponseStoreError as e:
        raise store_failed(e) from None
    if not gone:
        raise not_found(id)
    return _json({"id": id, "object": "response", "deleted": True})
