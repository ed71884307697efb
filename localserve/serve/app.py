"""The ASGI app on the server's one port: websockets to a `Connection` each, HTTP to Starlette.

HTTP is /healthz and /metrics (health.py), the chat page (page.py), the OpenAI API under /v1
(openai/), OpenAI's Responses API under /v1/responses (responses/), the Anthropic Messages API
under /v1/messages (anthropic/) and the Ollama API under
/api (ollama/), all with CORS for the web pages listed in `[server] allowed_origins` (cors.py).
A request from a web browser that is neither
this server's own page nor allowed (ops.auth.browser_refusal) is refused with a 403 before
anything else, websocket or HTTP; a websocket beyond max_connections gets a 503 instead of an
upgrade.

Tested in tests/e2e/test_websocket_connection.py and tests/e2e/test_chat_page.py.
"""

from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse

from localserve.ops.auth import browser_refusal
from localserve.ops.responses_store import ResponseStore
from localserve.serve import anthropic, ollama, openai, page, responses
from localserve.serve.cors import Cors
from localserve.serve.door import Frontdoor
from localserve.serve.health import Health
from localserve.serve.transport import client_address
from localserve.serve.websocket.connection import Connection
from localserve.serve.websocket.connections import Connections

log = logging.getLogger("localserve.serve.app")

RETRY_FULL_S = 5  # Retry-After of the 503 for a websocket beyond max_connections


class App:
    """The ASGI app: websockets here, HTTP to Starlette."""

    def __init__(
        self,
        door: Frontdoor,
        connections: Connections,
        health: Health,
        responses_store: ResponseStore | None = None,
    ) -> None:
        self.door = door
        self.connections = connections
        routes = [*health.routes(), *page.routes(), *openai.routes(door), *ollama.routes(door)]
        routes += anthropic.routes(door)
        routes += responses.routes(door, responses_store)
        handlers = ollama.exception_handlers(openai.exception_handlers())
        handlers = anthropic.exception_handlers(handlers)
        http = Starlette(routes=routes, exception_handlers=handlers)
        self.http = Cors(http, lambda: door.config.allowed_origins, (openai.PREFIX, ollama.PREFIX))

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "websocket":
            return await self._websocket(scope, receive, send)
        if refusal := self._browser_refusal(scope):
            return await PlainTextResponse(refusal + "\n", 403)(scope, receive, send)
        await self.http(scope, receive, send)

    def _browser_refusal(self, scope) -> str | None:
        c = self.door.config
        refusal = browser_refusal(scope["headers"], c.allowed_origins, c.allowed_hosts)
        if refusal is not None:
            log.warning("%s: %s", client_address(scope), refusal)
        return refusal

    async def _websocket(self, scope, receive, send) -> None:
        if refusal := self._browser_refusal(scope):
            return await _deny(send, 403, refusal + "\n")
        if self.connections.is_full:
            return await _deny(send, 503, "too many connections; try again later\n", RETRY_FULL_S)
        door = self.door
        conn = Connection(door, self.connections, scope, receive, send, door.next_number())
        self.connections.add(conn)
        await conn.run()


async def _deny(send, status: int, text: str, retry_after_s: int = 0) -> None:
    """Refuse a websocket upgrade with a plain HTTP answer."""
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8")]
    if retry_after_s:
        headers.append((b"retry-after", b"%d" % retry_after_s))
    await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})
