"""OpenAI's Responses API: `POST /v1/responses`, and the responses kept per person.

A front door of its own beside chat completions, through the same seam (serve/door.py): the
same users and trusted front-ends, limits, fairness, quotas, prefix isolation and cancellation;
its usage rows say `api = "responses"`. It builds on the OpenAI API's pieces (serve/openai/:
its errors' shape, its reading of the body and the user) and takes tools, forced calls and
structured output through the same paths as chat completions (serve/tool_use.py,
door.constraints). Responses kept (`store`) live in ops/responses_store.py. One module per noun:

- `types.py`: the request body as msgspec decodes it.
- `checks.py`: the fields refused by name, the tools, tool_choice and text.format, sampling.
- `items.py`: the input items and the previous responses' chain as the chat's messages.
- `output.py`: the output items and the stream events that write them.
- `reply.py`: the reply, whole or streamed, stored before it says it is done.
- `create.py`: `POST /v1/responses`.
- `stored.py`: `GET` and `DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`.

Tested in tests/e2e/test_responses_api.py; on a fake Frontdoor in tests/unit/serve/responses/.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request as HttpRequest
from starlette.responses import Response
from starlette.routing import Route

from localserve.ops.responses_store import ResponseStore
from localserve.serve.door import Frontdoor
from localserve.serve.responses.create import create_response
from localserve.serve.responses.stored import delete_response, get_input_items, get_response

PREFIX = "/v1/responses"

Endpoint = Callable[[Frontdoor, ResponseStore | None, HttpRequest], Awaitable[Response]]


def routes(door: Frontdoor, store: ResponseStore | None) -> list[Route]:
    """The API's routes, answering through `door`, keeping responses in `store` (None: none)."""
    return [
        Route(PREFIX, _bound(create_response, door, store), methods=["POST"]),
        # one route for both methods: CORS answers a preflight with its route's methods
        Route(f"{PREFIX}/{{id}}", _bound(_stored, door, store), methods=["GET", "DELETE"]),
        Route(
            f"{PREFIX}/{{id}}/input_items", _bound(get_input_items, door, store), methods=["GET"]
        ),  # fmt: skip
    ]


async def _stored(door: Frontdoor, store: ResponseStore | None, request: HttpRequest):
    endpoint = delete_response if request.method == "DELETE" else get_response
    return await endpoint(door, store, request)


def _bound(endpoint: Endpoint, door: Frontdoor, store: ResponseStore | None):
    async def handle(request: HttpRequest) -> Response:
        return await endpoint(door, store, request)

    return handle
