"""What the HTTP APIs' embedding endpoints share: the sink of one embedding request (its vectors,
then its `done`) and the ASGI response that sends them whole, the client watched meanwhile.

`EmbedReply` is an `HttpReply` (serve/http_reply.py: a client that closes its connection while
its request is admitted or embedded cancels it at the engine's next step, and a reply not
delivered cancels it too); the OpenAI and Ollama endpoints (serve/openai/embeddings.py,
serve/ollama/embed.py) give it `body`, the JSON of their own shape, and `failed`, their error.
The vectors are cut to the request's `dimensions` and encoded in a thread, off the loop.
Its usage rows say api "embeddings".

Tested on a fake Frontdoor in tests/unit/serve/openai/test_embeddings.py and
tests/unit/serve/ollama/test_embed.py; through the server in tests/e2e/test_embeddings.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec
from starlette.responses import Response

from localserve.engine.events import Done
from localserve.serve.door import Embedding, Frontdoor, Request
from localserve.serve.embedding_inputs import shorten
from localserve.serve.http_reply import HttpReply, no_receive

_encoder = msgspec.json.Encoder()

# an endpoint's reply body from the vectors and the done (made in a thread: no loop state)
Body = Callable[[list[list[float]], Done], dict]
# an endpoint's error response for a done that ended without vectors (cancelled, failed)
Failed = Callable[[Done], Response]


class EmbedReply(HttpReply):
    """One embedding request's reply: the sink (`on_embedded`, `on_done`) and its response."""

    api = "embeddings"  # in the usage record

    def __init__(
        self, door: Frontdoor, scope, client_id: str, user: str, body: Body, failed: Failed
    ) -> None:
        super().__init__(door, scope, False, client_id, user)
        self.vectors: list[list[float]] | None = None
        self._body, self._failed = body, failed

    def on_embedded(self, request: Request, vectors: list[list[float]]) -> None:
        self.vectors = vectors

    async def embed(
        self, receive, number: int, inputs: list, truncate: bool, **options
    ) -> Request | None:
        """The inputs handed to the door as this reply's (an `Embedding` with this reply as its
        sink, `number` the HTTP request's; `options`: its dimensions, keep_alive_s), the client
        watched meanwhile (one that leaves cancels it: None). Refusal as the door's."""
        engine_id = f"{number}:{self.client_id}"
        embedding = Embedding(self, self.user, self.client_id, engine_id, inputs, truncate,
                              cancelled=self.cancelled, **options)  # fmt: skip
        return await self._admitted(receive, self.door.embed(embedding))

    async def _send_whole(self, send) -> None:
        _, done = await self._whole()
        if done is None:
            return
        if done.finish_reason in ("error", "cancelled") or self.vectors is None:
            return await self._failed(done)(self.scope, no_receive, send)
        # 2,048 vectors of 640 floats are tens of milliseconds of encoding: in a thread, so the
        # loop goes on serving the others' streams meanwhile (it takes the GIL back every 5 ms)
        vectors, unrecorded = self.vectors, self._unrecorded({})
        dimensions = self.request.dimensions if self.request is not None else None
        encoded = await asyncio.to_thread(self._encoded, vectors, dimensions, done, unrecorded)
        await Response(encoded, media_type="application/json")(self.scope, no_receive, send)

    def _encoded(self, vectors, dimensions: int | None, done: Done, unrecorded: dict) -> bytes:
        """The reply's JSON: the vectors cut to `dimensions` (renormalised), in its shape."""
        return _encoder.encode(self._body(shorten(vectors, dimensions), done) | unrecorded)
