"""The Ollama API's model endpoints: `/api/version`, `/api/tags`, `/api/show`, `/api/ps`.

/api/tags lists every configured model (serve/pool.py), /api/ps the loaded ones with the
`expires_at` their keep_alive gives (far ahead for -1), /api/show describes one with its
`capabilities` (completion and embedding, and tools and thinking when localserve reads the
model's calls and reasoning). /api/pull is the operator's (manage.py); /api/create and the
other model-management calls are unknown paths (404). On a server with tokens these need a
user's token too.

Tested in tests/e2e/test_ollama_api.py; on a fake Frontdoor in tests/unit/serve/ollama/.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import msgspec
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from localserve.serve.door import Frontdoor
from localserve.serve.ollama.errors import OllamaError
from localserve.serve.ollama.types import ModelRequest
from localserve.serve.ollama.validation import check_model, identify, public_name, read_body

# what /api/version says: recent enough for clients that check it (tools, think, format)
VERSION = "0.12.0"
NEVER = "2318-01-01T00:00:00Z"  # /api/ps's expires_at of a model never unloaded (-1)

_encoder = msgspec.json.Encoder()


class OllamaModels:
    """The model endpoints; `started` is when the server started (the model's modified_at)."""

    def __init__(self, door: Frontdoor, started: float | None = None) -> None:
        self.door = door
        started = time.time() if started is None else started
        self.modified_at = datetime.fromtimestamp(started, UTC).isoformat().replace("+00:00", "Z")

    async def version(self, request: HttpRequest) -> Response:
        return _json({"version": VERSION})

    async def tags(self, request: HttpRequest) -> Response:
        await identify(self.door, request)
        return _json({"models": [self._card(m) for m in self.door.describe_models()]})

    async def ps(self, request: HttpRequest) -> Response:
        """The loaded models; `expires_at` when each is unloaded (its keep_alive)."""
        await identify(self.door, request)
        cards = []
        for m in self.door.describe_models():
            if m["state"] != "loaded":
                continue
            expires = m.get("expires_at")
            card = self._card(m) | {
                "expires_at": _iso(expires) if expires is not None else NEVER,
                "size_vram": 0,
                "context_length": m["n_ctx"],
            }
            del card["modified_at"]
            cards.append(card)
        return _json({"models": cards})

    async def show(self, request: HttpRequest) -> Response:
        await identify(self.door, request)
        body = await read_body(self.door, request, ModelRequest)
        name = body.model or body.name
        if not name:
            raise OllamaError(400, "model: the model to show is required")
        door = check_model(self.door, name)
        formats = door.formats
        capabilities = ["completion", "embedding"]  # every model embeds (pooled)
        if formats.tool is not None:
            capabilities.append("tools")
        if formats.reasoning is not None:
            capabilities.append("thinking")
        return _json(
            {
                "modelfile": "",
                "parameters": "",
                "template": "",
                "details": _details(),
                "model_info": {"general.context_length": door.max_model_len},
                "capabilities": capabilities,
                "modified_at": self.modified_at,
            }
        )

    def _card(self, model: dict) -> dict:
        name = public_name(model["name"])
        return {
            "name": name,
            "model": name,
            "modified_at": self.modified_at,
            "size": int((model["memory_mib"] or 0) * (1 << 20)),  # its estimated memory need
            "digest": "",
            "details": _details(),
        }


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _details() -> dict:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": "",
        "families": None,
        "parameter_size": "",
        "quantization_level": "",
    }


def _json(body) -> Response:
    return Response(_encoder.encode(body), media_type="application/json")
