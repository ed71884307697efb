"""The HTTP doors' streamed replies (serve/http_reply.py and each door's reply loop) pass on every
new place in line and predicted wait a waiting client is given, not only the first: each door,
on a fake Frontdoor (tests/support/fake_frontdoor.py), hears three in turn, then its reply.
(The websocket door's frames: tests/unit/serve/websocket/test_connection.py.)"""

from __future__ import annotations

import asyncio
import re

import pytest
from starlette.applications import Starlette

from localserve.serve import anthropic, ollama, openai, responses
from tests.support.asgi import HttpExchange, wait_for
from tests.support.fake_frontdoor import FakeFrontdoor

ASK = [{"role": "user", "content": "What is the capital of France?"}]
DOORS = {
    "openai chat": ("/v1/chat/completions", {"messages": ASK, "stream": True}),
    "openai completions": ("/v1/completions", {"prompt": "The capital is", "stream": True}),
    "responses": ("/v1/responses", {"input": "What is the capital of France?", "stream": True}),
    "ollama chat": ("/api/chat", {"model": "tiny", "messages": ASK}),
    "ollama generate": ("/api/generate", {"model": "tiny", "prompt": "The capital is"}),
    "anthropic": (
        "/v1/messages",
        {"model": "tiny", "max_tokens": 50, "messages": ASK, "stream": True},
    ),
}
# what the engine tells a waiting request as its place and prediction change (routing.py)
NOTES = [(3, 12.04), (3, 6.0), (1, None)]


def app_of(door: FakeFrontdoor) -> Starlette:
    """Every HTTP door, mounted as serve/app.py mounts them."""
    routes = openai.routes(door) + responses.routes(door, None)
    routes += ollama.routes(door) + anthropic.routes(door)
    handlers = anthropic.exception_handlers(ollama.exception_handlers(openai.exception_handlers()))
    return Starlette(routes=routes, exception_handlers=handlers)


def notes_in(body: bytes) -> list[tuple[int, float | None]]:
    """The waiting notes of a stream, in order: SSE comments, or Ollama's `queue` objects."""
    sse = r": queued position=(\d+)(?: wait_s=([\d.]+))?"
    ndjson = r'"queue":\{"position":(\d+)(?:,"wait_s":([\d.]+))?'
    found = re.findall(f"{sse}|{ndjson}", body.decode())
    notes = []
    for p1, w1, p2, w2 in found:
        position, wait = (p1, w1) if p1 else (p2, w2)
        notes.append((int(position), float(wait) if wait else None))
    return notes


@pytest.mark.parametrize("door_name", DOORS)
def test_a_waiting_stream_hears_every_new_place_and_predicted_wait(door_name):
    path, body = DOORS[door_name]

    async def scenario():
        door = FakeFrontdoor()
        stream = HttpExchange(app_of(door), "POST", path, body).start()
        request = await door.admitted()
        for n, (position, wait_s) in enumerate(NOTES, 1):
            door.queued(request, position, wait_s)
            await wait_for(lambda n=n: len(notes_in(stream.body)) == n, what=f"note {n}")
        door.token(request, "Paris")
        door.finish(request)
        await stream.finished()
        return stream

    stream = asyncio.run(scenario())
    assert stream.status == 200
    assert notes_in(stream.body) == [(3, 12.0), (3, 6.0), (1, None)]
    assert b"Paris" in stream.body  # and the reply after them
