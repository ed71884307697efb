"""`GET /v1/models` and `GET /v1/models/{model}`: the one model this server has, with its context
length (`max_model_len`, as vLLM names it: prompt and reply together, in tokens).

Both need the same API key as the other endpoints on a server with tokens; an unknown model is
a 404 that names the one there is.

Tested in tests/e2e/test_openai_api.py; on a fake Frontdoor in tests/unit/serve/openai/.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from localserve.serve.door import Frontdoor
from localserve.serve.openai.validation import check_model, identify

_encoder = msgspec.json.Encoder()


class Models:
    """The models endpoints; `created` is when the server started."""

    def __init__(self, door: Frontdoor, created: int) -> None:
        self.door = door
        self.created = created

    async def list_models(self, request: HttpRequest) -> Response:
        await identify(self.door, request, None)
        cards = [self._card(m) for m in self.door.describe_models()]
        return _json({"object": "list", "data": cards})

    async def get_model(self, request: HttpRequest) -> Response:
        await identify(self.door, request, None)
        door = check_model(self.door, request.path_params["model"])
        return _json(self._card(door.describe_models()[door.model_names.index(door.model_name)]))

    def _card(self, model: dict) -> dict:
        """One model's card; `status` its state in the pool (loaded, loading, unloaded,
        failed), with `memory_mib` its estimated need."""
        return {
            "id": model["name"],
            "object": "model",
            "created": self.created,
            "owned_by": "localserve",
            "max_model_len": model["n_ctx"],  # the context length, as vLLM says it
            "status": model["state"],
            "memory_mib": model["memory_mib"],
        }


def _json(body) -> Response:
    return Response(_encoder.encode(body), media_type="application/json")
