"""CORS for the pages listed in `[server] allowed_origins`, against the real server on loopback
with the real model: preflights and answers read with httpx, then a page on a second loopback
origin calling the APIs with fetch() in the system's headless Chromium (and the same page from
an origin not listed, which the browser must not let read anything).

Hostile preflights (huge header lists, odd methods) are in test_hostile_clients.py.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import threading

import httpx
import pytest

from localserve.ops.auth import Access
from localserve.serve.cors import MAX_AGE_S
from tests.support.live import configured

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m"
TOKEN = "alice-token-cors"
PAGE = "http://127.0.0.1:1"  # the listed page's origin in the httpx tests (nothing listens)
EXTENSION = "chrome-extension://abcdefghijklmnopabcdefghijklmnop"
SDK_HEADERS = (
    "authorization, content-type, x-api-key, anthropic-version, anthropic-beta, "
    "anthropic-dangerous-direct-browser-access, x-stainless-arch, x-stainless-lang, "
    "x-stainless-os, x-stainless-package-version, x-stainless-retry-count, "
    "x-stainless-runtime, x-stainless-runtime-version, x-stainless-timeout, "
    "openai-organization, openai-project, x-openwebui-user-name, x-openwebui-user-id, "
    "x-localserve-user"
)
ROUTES = [
    ("/v1/chat/completions", "POST", "POST"),
    ("/v1/models", "GET", "GET, HEAD"),
    ("/api/chat", "POST", "POST"),
    ("/api/tags", "GET", "GET, HEAD"),
]
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
OLLAMA_CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "options": {"num_predict": 4}}


@pytest.fixture
def listed(live):
    """The live server with a token and these origins listed."""

    def make(*origins: str):
        return configured(live, access=Access({"alice": TOKEN}), allowed_origins=list(origins))

    return make


def preflight(live, path: str, method: str, origin: str = PAGE, headers: str = SDK_HEADERS):
    asked = {"Origin": origin, "Access-Control-Request-Method": method}
    return httpx.options(
        live.http + path, headers=asked | {"Access-Control-Request-Headers": headers}
    )


def send(live, method: str, path: str, body=None, origin: str | None = PAGE, token=TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    headers |= {"Origin": origin} if origin else {}
    return httpx.request(method, live.http + path, json=body, headers=headers, timeout=60)


def assert_allowed(response, origin: str = PAGE) -> None:
    assert response.headers["access-control-allow-origin"] == origin
    assert "Origin" in response.headers["vary"]
    exposed = response.headers["access-control-expose-headers"].lower()
    assert "retry-after" in exposed and "x-localserve-dropped-messages" in exposed
    assert "access-control-allow-credentials" not in response.headers


def test_a_listed_page_gets_its_preflights_answered_without_a_token(live, listed):
    with listed(PAGE, EXTENSION):
        for path, method, methods in ROUTES:
            r = preflight(live, path, method)
            assert r.status_code == 200 and r.text == "OK", (path, r.text)  # nothing else
            h = r.headers
            assert h["access-control-allow-origin"] == PAGE  # its own origin, never *
            assert h["access-control-allow-methods"] == methods
            assert h["access-control-allow-headers"] == SDK_HEADERS
            assert h["access-control-max-age"] == str(MAX_AGE_S)
            assert "Origin" in h["vary"] and "access-control-allow-credentials" not in h
        r = preflight(live, "/v1/chat/completions", "POST", origin=EXTENSION)  # an extension's
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == EXTENSION
        r = send(live, "GET", "/v1/models", origin=EXTENSION)
        assert r.status_code == 200
        assert_allowed(r, EXTENSION)
        # a method its route does not take is refused; so is a path no route has
        assert preflight(live, "/v1/models", "POST").status_code == 400
        assert preflight(live, "/api/chat", "DELETE").status_code == 400
        assert preflight(live, "/v1/nothing", "POST").status_code == 404


def test_a_listed_page_reads_answers_streams_and_errors(live, listed):
    with listed(PAGE):
        r = send(live, "POST", "/v1/chat/completions", CHAT)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        assert_allowed(r)
        r = send(live, "POST", "/v1/chat/completions", CHAT | {"stream": True})
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        assert r.headers["content-type"].startswith("text/event-stream")
        assert_allowed(r)
        r = send(live, "GET", "/v1/models")
        assert r.json()["data"][0]["id"] == MODEL
        assert_allowed(r)
        r = send(live, "POST", "/api/chat", OLLAMA_CHAT)  # streamed, as Ollama does by default
        lines = [json.loads(line) for line in r.text.splitlines()]
        assert r.headers["content-type"] == "application/x-ndjson" and lines[-1]["done"]
        assert_allowed(r)
        r = send(live, "POST", "/api/chat", OLLAMA_CHAT | {"stream": False})
        assert r.json()["message"]["content"]
        assert_allowed(r)
        r = send(live, "GET", "/api/tags")
        assert r.json()["models"]
        assert_allowed(r)
        # errors: the real request needs its token; a wrong path; a wrong method
        for method, path, token in [
            ("POST", "/v1/chat/completions", None),
            ("GET", "/v1/models", "wrong-token-x"),
            ("POST", "/api/chat", None),
            ("GET", "/v1/nothing", TOKEN),
            ("DELETE", "/api/tags", TOKEN),
        ]:
            r = send(live, method, path, CHAT if method == "POST" else None, token=token)
            assert r.status_code in (401, 404, 405), (path, r.status_code)
            assert_allowed(r)


def test_other_origins_are_refused_as_before_and_other_paths_get_no_cors(live, listed):
    with listed(PAGE):
        for path, method, _ in ROUTES:
            r = preflight(live, path, method, origin="http://evil.example")
            assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
            r = send(live, method, path, origin="http://127.0.0.1:2")
            assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        own = live.http  # the server's own page: same origin, no CORS needed nor given
        r = send(live, "GET", "/v1/models", origin=own)
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
        for path in ["/", "/healthz", "/metrics", "/app.js"]:
            r = httpx.get(live.http + path, headers={"Origin": PAGE})
            assert r.status_code in (200, 401), path  # /metrics wants the monitor token
            assert not [h for h in r.headers if h.startswith("access-control-")], path
            assert preflight(live, path, "GET").status_code == 405, path
        r = send(live, "POST", "/v1/chat/completions", CHAT, origin=None)  # curl, the SDKs
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    # a server listing no origin answers a preflight as before: its route takes no OPTIONS
    with configured(live, allowed_origins=[]):
        assert preflight(live, "/v1/models", "GET", origin=live.http).status_code == 405


# --- a real browser --------------------------------------------------------------------------

CHROMIUM = (
    os.environ.get("LOCALSERVE_CHROMIUM")
    or shutil.which("chromium")
    or shutil.which("chromium-browser")
)
CALLS = """async ([server, token]) => {
    const ask = {role: 'user', content: 'Say hi.'};
    const headers = {'Authorization': 'Bearer ' + token, 'Content-Type': 'application/json',
                     'X-Stainless-OS': 'Linux', 'X-Stainless-Retry-Count': '0'};
    const call = async (path, body) => {
        try {
            const r = await fetch(server + path, {method: 'POST', headers,
                                                  body: JSON.stringify(body)});
            return {status: r.status, text: await r.text(),
                    dropped: r.headers.get('x-localserve-dropped-messages')};
        } catch (e) { return {error: String(e)}; }
    };
    const chat = {model: 'gemma-3-270m', messages: [ask], max_tokens: 4};
    return {
        whole: await call('/v1/chat/completions', chat),
        stream: await call('/v1/chat/completions', {...chat, stream: true}),
        ollama: await call('/api/chat', {messages: [ask], options: {num_predict: 4}}),
    };
}"""


class StaticPage:
    """A tiny page on a loopback port of its own: another origin than the server's."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b"<!doctype html><title>another origin</title><p>a page elsewhere</p>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def pages():
    made = [StaticPage(), StaticPage()]
    yield made
    for page in made:
        page.close()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM:
        if os.environ.get("LOCALSERVE_REQUIRE_BROWSER"):
            pytest.fail("no Chromium")
        pytest.skip("no Chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium's sandbox refuses root
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        yield browser
        browser.close()


def calls_from(browser, page: StaticPage, live) -> tuple[dict, list[str]]:
    """What the page's fetch() calls to the server got, and its console's messages."""
    context = browser.new_context()
    tab = context.new_page()
    console: list[str] = []
    tab.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    tab.goto(page.origin + "/")
    got = tab.evaluate(CALLS, [live.http, TOKEN])
    context.close()
    return got, console


def test_a_page_on_a_listed_origin_uses_the_apis_from_a_browser(browser, live, listed, pages):
    mine, theirs = pages
    with listed(mine.origin):
        got, console = calls_from(browser, mine, live)
        whole, stream, ollama = got["whole"], got["stream"], got["ollama"]
        assert whole["status"] == 200, got
        assert json.loads(whole["text"])["choices"][0]["message"]["content"]
        assert whole["dropped"] == "0"  # an exposed header the page may read
        assert stream["status"] == 200 and stream["text"].endswith("data: [DONE]\n\n"), got
        assert ollama["status"] == 200, got
        assert json.loads(ollama["text"].splitlines()[-1])["done"] is True
        assert not [m for m in console if m.startswith("error")], console

        got, console = calls_from(browser, theirs, live)  # not listed: the browser reads nothing
        assert all("error" in call and "status" not in call for call in got.values()), got
        assert any("CORS" in m for m in console), console
