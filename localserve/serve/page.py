"""The chat page: static files shipped inside the package (localserve/serve/web/), served at `/`.

No build step, no CDN, no external fonts: the HTML, CSS and JavaScript below and the vendored
Markdown parser and sanitizer (web/vendor/, see its README) are read once and served from
memory, so the page works on a LAN without internet. Only these exact paths are served (no
path from a request ever reaches the file system).

Every answer carries a strict Content-Security-Policy: scripts and styles only from this
server's own files (no inline script, no `eval`), connections only back to it, no images, frames,
forms or plugins from anywhere. Model text is rendered by app.js with raw HTML shown as text and
DOMPurify over the Markdown's output; the policy is the layer under that.

Tested in tests/e2e/test_chat_page.py.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import NamedTuple

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",  # the websocket too: CSP 3's 'self' matches ws: on the same host
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-cache",  # revalidated with the ETag: a new version shows at once
}

FILES = {  # path -> (file under web/, media type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/app.css": ("app.css", "text/css; charset=utf-8"),
    "/icon.svg": ("icon.svg", "image/svg+xml"),
    "/vendor/marked.min.js": ("vendor/marked.min.js", "text/javascript; charset=utf-8"),
    "/vendor/purify.min.js": ("vendor/purify.min.js", "text/javascript; charset=utf-8"),
}


class File(NamedTuple):
    body: bytes
    media_type: str
    etag: str


def _load() -> dict[str, File]:
    root = resources.files("localserve.serve") / "web"
    files = {}
    for path, (name, media_type) in FILES.items():
        body = (root / name).read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
        files[path] = File(body, media_type, etag)
    return files


_files: dict[str, File] | None = None


def files() -> dict[str, File]:
    global _files
    if _files is None:
        _files = _load()
    return _files


async def serve(request: Request) -> Response:
    file = files()[request.url.path]
    headers = HEADERS | {"ETag": file.etag}
    if file.etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    return Response(file.body, media_type=file.media_type, headers=headers)


def routes() -> list[Route]:
    return [Route(path, serve, methods=["GET", "HEAD"]) for path in FILES]
