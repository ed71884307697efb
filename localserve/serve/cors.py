"""CORS for the HTTP APIs (/v1 and /api), for the web pages listed in `[server] allowed_origins`.

By the time a request gets here, `browser_refusal` (app.py) has refused every other foreign
origin with a 403, preflights included. What is left is letting a listed page's browser use the
APIs: a preflight (`OPTIONS` with Access-Control-Request-Method) is answered without a token
(browsers send none on a preflight) and says nothing but the CORS policy; every other request
goes on to its route, which wants its token as always, and its answer (a whole reply, an SSE or
NDJSON stream, an error) gets Access-Control-Allow-Origin and -Expose-Headers.

Starlette's CORSMiddleware does the headers. Around it:
- only paths under the given prefixes, and only while some origin is listed: the page, /healthz
  and /metrics never get CORS headers, and a server that lists none answers exactly as before;
- one middleware per set of methods a route takes, so a preflight is told, and checked against,
  its own route's methods (a GET-only route refuses a preflight for POST); a path no route has
  gets the routes' 404;
- a preflight's Access-Control-Request-Headers is client input: at most MAX_REQUESTED_HEADERS
  header names (RFC 9110 tokens) in MAX_REQUESTED_CHARS characters, else a 400 naming the field.
  Within that bound the requested headers are allowed as asked (reflected): the origin is one
  the operator trusts, and a fixed list would break a browser client whenever its SDK adds a
  header (the openai and anthropic JS SDKs add x-stainless-* ones release by release);
- Access-Control-Allow-Origin is the request's own origin, never `*`, with `Vary: Origin`, so a
  cached answer is never reused for another page; no Access-Control-Allow-Credentials: tokens
  travel in headers the page sets itself, never in cookies, so the browser's own credentials
  are never sent along;
- Access-Control-Allow-Private-Network for a listed origin (Chrome asks it of a public page
  calling a server on the home network): listing the origin is the operator's consent.

The middlewares are built anew when allowed_origins changes (it is read at every request).

Tested in tests/e2e/test_cors.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import PlainTextResponse
from starlette.routing import Match

from localserve.ops.auth import normal_origin
from localserve.serve.openai.reply import DROPPED_HEADER

MAX_AGE_S = 600  # how long a browser may keep a preflight's answer
MAX_REQUESTED_CHARS = 2000  # the openai and anthropic SDKs ask for about 400
MAX_REQUESTED_HEADERS = 48
# what clients read of an answer, besides the headers every CORS answer shows
EXPOSED = ("Retry-After", "WWW-Authenticate", DROPPED_HEADER)
_NAME = r"[ \t]*[!#$%&'*+.^_`|~0-9A-Za-z-]+[ \t]*"  # an RFC 9110 token, spaces around it
_NAMES = re.compile(f"{_NAME}(,{_NAME})*")


class Cors:
    """The HTTP app (`app`) with CORS under `prefixes` for the origins `origins()` lists."""

    def __init__(
        self, app: Starlette, origins: Callable[[], list[str]], prefixes: tuple[str, ...]
    ) -> None:
        self.app = app
        self.origins = origins
        self.prefixes = prefixes
        self._built_for: tuple[str, ...] = ()
        self._by_methods: dict[frozenset[str], ListedOrigins] = {}

    async def __call__(self, scope, receive, send) -> None:
        origins = tuple(self.origins())
        if scope["type"] != "http" or not origins or not self._is_api(scope["path"]):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        methods: frozenset[str] = frozenset()  # any middleware adds the answer's headers
        if _is_preflight(scope, headers):
            if problem := requested_headers_problem(headers.get("access-control-request-headers")):
                return await PlainTextResponse(problem + "\n", 400)(scope, receive, send)
            found = self._route_methods(scope)
            if found is None:
                return await self.app(scope, receive, send)  # no such path: its 404
            methods = found
        await self._middleware(origins, methods)(scope, receive, send)

    def _is_api(self, path: str) -> bool:
        return any(path == p or path.startswith(p + "/") for p in self.prefixes)

    def _route_methods(self, scope) -> frozenset[str] | None:
        """The methods of the route at the request's path, None when no route is there."""
        for route in self.app.router.routes:
            methods = getattr(route, "methods", None)
            if methods and route.matches(scope)[0] != Match.NONE:
                return frozenset(methods)
        return None

    def _middleware(self, origins: tuple[str, ...], methods: frozenset[str]) -> ListedOrigins:
        if origins != self._built_for:
            self._built_for, self._by_methods = origins, {}
        middleware = self._by_methods.get(methods)
        if middleware is None:
            middleware = self._by_methods[methods] = ListedOrigins(
                self.app,
                allow_origins=origins,
                allow_methods=sorted(methods),
                allow_headers=["*"],  # reflected, once requested_headers_problem passed them
                expose_headers=EXPOSED,
                max_age=MAX_AGE_S,
                allow_private_network=True,
            )
        return middleware


class ListedOrigins(CORSMiddleware):
    """Starlette's CORSMiddleware, an origin compared as browser_refusal compares it (lower
    case, no trailing slash), so the origins it lets through are exactly those it allows."""

    def is_allowed_origin(self, origin: str) -> bool:
        return normal_origin(origin) in self.allow_origins


def _is_preflight(scope, headers: Headers) -> bool:
    return (
        scope["method"] == "OPTIONS"
        and "origin" in headers
        and "access-control-request-method" in headers
    )


def requested_headers_problem(value: str | None) -> str | None:
    """What is wrong with a preflight's Access-Control-Request-Headers, None when it may be
    allowed as asked: a list of header names, bounded."""
    if value is None or not value.strip():
        return None
    if len(value) > MAX_REQUESTED_CHARS:
        return f"Access-Control-Request-Headers: longer than {MAX_REQUESTED_CHARS} characters"
    if not _NAMES.fullmatch(value):
        return "Access-Control-Request-Headers: expected header names separated by commas"
    if value.count(",") >= MAX_REQUESTED_HEADERS:
        return f"Access-Control-Request-Headers: more than {MAX_REQUESTED_HEADERS} headers"
    return None
