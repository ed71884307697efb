"""The chat page at `/`, in a real browser: the system's headless Chromium, driven by Playwright.

The page's own HTTP answers (files, headers, the origin rule) need no browser. The browser tests
chat through the real model (two people streaming at once, the queue position, Stop) and through
the fake runner where the reply must be a chosen text (a hostile one, a wide one). Without
Chromium they are skipped, unless LOCALSERVE_REQUIRE_BROWSER is set (CI sets it): then they fail.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest

from localserve.bench.fake_server import FakeServer
from localserve.ops.auth import Access
from localserve.serve.page import CSP
from tests.support.cli import kill_serve, start_serve
from tests.support.fakes import ScriptedRunner, two_fake_models
from tests.support.waiting import wait_until

CHROMIUM = (
    os.environ.get("LOCALSERVE_CHROMIUM")
    or shutil.which("chromium")
    or shutil.which("chromium-browser")
)
PHONE = {"width": 390, "height": 844}
LAPTOP = {"width": 1100, "height": 720}
LONG_PROMPT = "Count from 1 to 300, one number per line."  # greedy: runs to max_tokens


def get(url: str, headers: dict | None = None, method: str = "GET", data: bytes | None = None):
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


# --- the page's files and headers (no browser) --------------------------------------------------


@pytest.fixture(scope="module")
def fake_server():
    server = FakeServer()
    yield server
    server.close()


def test_page_and_its_files_are_served_with_a_strict_policy(fake_server):
    status, headers, body = get(fake_server.http + "/")
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["Content-Security-Policy"] == CSP
    assert "script-src 'self'" in CSP and "unsafe" not in CSP
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["X-Frame-Options"] == "DENY"
    assert b'<script src="app.js"' in body
    assert b"http" not in body.replace(b"http-equiv", b"")  # nothing from another server
    for path, kind in [
        ("/app.js", "text/javascript"),
        ("/app.css", "text/css"),
        ("/vendor/marked.min.js", "text/javascript"),
        ("/vendor/purify.min.js", "text/javascript"),
        ("/icon.svg", "image/svg+xml"),
    ]:
        status, headers, body = get(fake_server.http + path)
        assert status == 200 and headers["Content-Type"].startswith(kind), path
        assert body and headers["Content-Security-Policy"] == CSP
    status, headers, _ = get(fake_server.http + "/", {"If-None-Match": headers["ETag"]})
    assert status == 200  # another file's tag
    etag = get(fake_server.http + "/")[1]["ETag"]
    assert get(fake_server.http + "/", {"If-None-Match": etag})[0] == 304
    for path in ["/vendor/", "/vendor/../app.js", "/web/index.html", "/index.html", "/app.js/x"]:
        assert get(fake_server.http + path)[0] == 404, path
    assert get(fake_server.http + "/", method="POST", data=b"x")[0] == 405


def test_healthz_has_what_the_status_line_shows(fake_server):
    status, _, body = get(fake_server.http + "/healthz")
    health = json.loads(body)
    assert status == 200 and health["ok"] is True and health["tokens"] is False
    assert health["kv_total"] == 4096 and health["max_running"] == 8
    assert {"running", "waiting", "kv_used", "kv_cached", "model", "backend"} <= set(health)


def upgrade(server, headers: dict) -> int:
    """The status of a websocket upgrade sent with these headers (Host included)."""
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        lines = [
            "GET / HTTP/1.1",
            "Upgrade: websocket",
            "Connection: Upgrade",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version: 13",
            *(f"{k}: {v}" for k, v in headers.items()),
        ]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return int(sock.recv(1024).split()[1])


def post(server, headers: dict) -> int:
    body = json.dumps({"model": "fake", "messages": [{"role": "user", "content": "hi"}]})
    connection = http.client.HTTPConnection("127.0.0.1", int(server.url.rsplit(":", 1)[1]))
    connection.request(
        "POST", "/v1/chat/completions", body, {"Content-Type": "text/plain"} | headers
    )
    response = connection.getresponse()
    response.read()
    connection.close()
    return response.status


def test_other_web_pages_may_not_use_the_server(fake_server):
    """A page on the internet that someone at home visits cannot chat through the server, not
    even by making its own name resolve to the server (DNS rebinding)."""
    own = fake_server.http.removeprefix("http://")  # 127.0.0.1:port
    port = own.rsplit(":", 1)[1]
    evil = f"attacker.example:{port}"
    assert upgrade(fake_server, {"Host": own, "Origin": f"http://{own}"}) == 101  # its page
    assert upgrade(fake_server, {"Host": own}) == 101  # not a browser
    assert upgrade(fake_server, {"Host": evil}) == 101  # not a browser: any name
    assert (
        upgrade(fake_server, {"Host": f"LocalHost:{port}", "Origin": f"http://localhost:{port}"})
        == 101
    )
    assert upgrade(fake_server, {"Host": f"[::1]:{port}", "Origin": f"http://[::1]:{port}"}) == 101
    for host, origin in [
        (own, "http://evil.example"),  # another page
        (own, "null"),
        (own, f"http://localhost:{port}"),  # another origin, though the same machine
        (own, f"http://{own}/path"),
        (evil, f"http://{evil}"),  # rebinding: the page and the name are the attacker's
        (f"attacker.example:{port}.", f"http://attacker.example:{port}"),
    ]:
        assert upgrade(fake_server, {"Host": host, "Origin": origin}) == 403, (host, origin)
        assert post(fake_server, {"Host": host, "Origin": origin}) == 403, (host, origin)
    assert post(fake_server, {"Host": own, "Origin": f"http://{own}"}) == 200
    assert post(fake_server, {"Host": evil}) == 200  # curl, the openai package: any name
    status, _, text = get(
        fake_server.http + "/metrics", {"Host": evil, "Sec-Fetch-Site": "same-origin"}
    )
    assert status == 403 and b"allowed_hosts" in text  # a rebound page reading the stats
    assert get(fake_server.http + "/metrics", {"Host": evil})[0] == 200
    server = fake_server.server
    old = server.config
    try:
        origins = ["https://chat.example.org"]
        server.config = msgspec.structs.replace(
            old, allowed_origins=origins, allowed_hosts=["attacker.example"]
        )
        assert upgrade(fake_server, {"Host": own, "Origin": "https://chat.example.org"}) == 101
        assert upgrade(fake_server, {"Host": evil, "Origin": f"http://{evil}"}) == 101
    finally:
        server.config = old


# --- the browser --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM:
        why = "no Chromium (apt-get install chromium; `make test` installs it when it can)"
        if os.environ.get("LOCALSERVE_REQUIRE_BROWSER"):
            pytest.fail(why)
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium's sandbox refuses root
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        yield browser
        browser.close()


@dataclass
class Person:
    """One person at the chat page, in a browser context of their own (own localStorage)."""

    page: object
    problems: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, browser, server, user: str | None, token=None, viewport=LAPTOP, context=None):
        """A new browser (context) for this person, or another tab of `context`."""
        context = context or browser.new_context(viewport=viewport)
        person = cls(context.new_page())
        person.page.on("pageerror", lambda e: person.problems.append(f"error: {e}"))
        person.page.on(
            "console",
            lambda m: m.type in ("error", "warning") and person.problems.append(m.text),
        )
        person.page.goto(server.http + "/")
        if user is not None:
            person.sign_in(user, token)
        return person

    def sign_in(self, user: str, token: str | None = None, ready: bool = True) -> None:
        page = self.page
        page.wait_for_selector("#signin[open]")
        page.fill("#signin-user", user)
        if token is not None:
            page.fill("#signin-token", token)
        page.click("#signin-go")
        if ready:
            page.wait_for_selector("#input:not([disabled])")

    def settings(self, temperature: float, max_tokens: int) -> None:
        self.page.click("#settings-open")
        self.page.fill("#set-temperature", str(temperature))
        self.page.fill("#set-max-tokens", str(max_tokens))
        self.page.click("#settings-save")

    def say(self, text: str) -> None:
        self.page.fill("#input", text)
        self.page.press("#input", "Enter")

    def reply(self):
        return self.page.locator(".msg.assistant").last

    def reply_status(self) -> str:
        return self.reply().get_attribute("data-status") or ""

    def wait_reply(self, *statuses: str, timeout: float = 120) -> None:
        wait_until(lambda: self.reply_status() in statuses, timeout, f"a reply {statuses}")

    def prompt_tokens(self) -> int:
        """The last reply's prompt tokens, as its line of figures says ("prompt 37 (0 cached)")."""
        meta = self.reply().locator(".meta").inner_text()
        return int(meta.split("prompt ")[1].split()[0])

    def chat_titles(self) -> list[str]:
        return self.page.locator("#chat-list .open").all_inner_texts()

    def close(self) -> None:
        self.page.context.close()
        assert not self.problems, self.problems  # no script error, no CSP violation


HOSTILE = [
    "Here you go:\n\n",
    "<script>window.pwned = 'script'</script>\n\n",
    "<img src=x onerror=\"window.pwned = 'img'\">\n\n",
    "[click me](javascript:window.pwned='link') and ",
    "[also](JaVaScRiPt:window.pwned='link2') and ",
    "<a href=\"javascript:window.pwned='a'\">raw link</a> and ",
    "![pic](javascript:window.pwned='image') and ",
    "<svg onload=\"window.pwned='svg'\"></svg> and ",
    "<iframe src=\"javascript:window.pwned='frame'\"></iframe>\n\n",
    "**bold** and `code` and [a real link](https://example.org/).\n\n",
    "See https://example.com/search?q=a&lang=en for more.",
]


@pytest.fixture
def scripted():
    def make(reply: list[str], runner: ScriptedRunner | None = None, **config) -> FakeServer:
        runner = runner or ScriptedRunner(n_ctx=4096, n_seq_max=8, step_s=0.01, reply=reply)
        server = FakeServer(runner=runner, **config)
        made.append(server)
        return server

    made: list[FakeServer] = []
    yield make
    for server in made:
        server.close()


def test_a_hostile_reply_runs_nothing(browser, scripted):
    server = scripted(HOSTILE)
    alice = Person.open(browser, server, "alice")
    alice.say("Show me some HTML")
    alice.wait_reply("done")
    body = alice.reply().locator(".body")
    text = body.inner_text()
    assert "<script>window.pwned = 'script'</script>" in text  # shown as text
    assert "onerror" in text and "javascript:window.pwned='link'" in text
    elements = body.evaluate("""(b) => [...b.querySelectorAll('*')].map((e) =>
        [e.tagName, ...[...e.attributes].map((a) => a.name + '=' + a.value)].join(' '))""")
    assert not [e for e in elements if e.split()[0] in ("SCRIPT", "IMG", "SVG", "IFRAME")]
    assert not [e for e in elements if " on" in e or "javascript:" in e.lower()], elements
    assert body.locator("strong").inner_text() == "bold"  # Markdown still renders
    link = body.locator('a[href="https://example.org/"]')
    assert link.get_attribute("rel") == "noopener noreferrer nofollow"
    for a in body.locator("a").all():
        assert a.get_attribute("href").startswith("https://")
    bare = body.locator("a", has_text="example.com/search")  # a bare address, & and all
    assert bare.get_attribute("href") == "https://example.com/search?q=a&lang=en"
    alice.page.click("text=click me")  # a javascript: link is text: clicking runs nothing
    assert alice.page.evaluate("window.pwned") is None
    alice.close()


def test_phone_screen_has_no_horizontal_scrolling(browser, scripted):
    wide = "x" * 300
    reply = [
        f"A long word: {wide}\n\n",
        f"```\n{'code ' * 80}\n```\n\n",
        "| a | b | c | d | e | f | g | h |\n|---|---|---|---|---|---|---|---|\n",
        f"| {wide[:40]} | {wide[:40]} | 3 | 4 | 5 | 6 | 7 | 8 |\n\n",
        f"https://example.org/{wide}\n",
    ]
    server = scripted(reply)
    bob = Person.open(browser, server, "bob", viewport=PHONE)
    bob.say(f"Something wide please {wide}")
    bob.wait_reply("done")
    page = bob.page
    overflow = """() => {
        const d = document.documentElement, m = document.getElementById('messages');
        const wide = [...document.querySelectorAll('body *')].filter((e) => {
            const r = e.getBoundingClientRect();
            return r.width && r.right > innerWidth + 1 && !e.closest('pre, table, #chats');
        }).map((e) => e.tagName + '.' + e.className);
        return {doc: d.scrollWidth - d.clientWidth, messages: m.scrollWidth - m.clientWidth, wide};
    }"""
    assert page.evaluate(overflow) == {"doc": 0, "messages": 0, "wide": []}
    page.click("#chats-toggle")  # the conversation list is a drawer on a phone
    page.wait_for_selector("#chats.open")
    assert page.locator("#chat-list li").count() == 1
    page.click("#new-chat")
    assert page.evaluate(overflow) == {"doc": 0, "messages": 0, "wide": []}
    bob.close()


def test_conversations_are_kept_and_each_turn_sends_the_whole_history(browser, scripted):
    server = scripted(["Sure.", " Done."])
    carol = Person.open(browser, server, "carol")
    page = carol.page
    carol.say("first question")
    carol.wait_reply("done")
    first = carol.prompt_tokens()
    page.fill("#input", "second question,\nwith a second line")  # Shift+Enter: a new line
    page.press("#input", "End")
    page.keyboard.press("Shift+Enter")
    assert page.input_value("#input").count("\n") == 2
    page.press("#input", "Enter")
    wait_until(lambda: page.locator(".msg.assistant").count() == 2, 30, "a second reply")
    carol.wait_reply("done")
    second = carol.prompt_tokens()
    assert second > first + 4  # the first turn, its reply and the new question
    page.click("#new-chat")
    carol.say("another topic")
    carol.wait_reply("done")
    assert page.locator("#chat-list li").count() == 2
    page.reload()  # kept in the browser
    page.wait_for_selector("#input:not([disabled])")
    titles = page.locator("#chat-list .open").all_inner_texts()
    assert titles == ["another topic", "first question"]
    page.locator("#chat-list .open", has_text="first question").click()
    assert page.locator(".msg.user").count() == 2
    delete = page.locator("#chat-list li", has_text="another topic").locator(".delete")
    delete.click()  # the first click asks
    assert page.locator("#chat-list li").count() == 2
    delete.click()
    assert page.locator("#chat-list .open").all_inner_texts() == ["first question"]
    carol.close()


def shot(page, name: str) -> None:
    """A screenshot into $LOCALSERVE_SCREENSHOTS, when set: to look at what a test saw."""
    if folder := os.environ.get("LOCALSERVE_SCREENSHOTS"):
        page.screenshot(path=os.path.join(folder, f"{name}.png"))


def test_before_signing_in_the_page_says_not_signed_in(browser, fake_server):
    """Nobody has signed in yet: nothing is disconnected, the status line says so plainly."""
    eve = Person.open(browser, fake_server, None)
    page = eve.page
    page.wait_for_selector("#signin[open]")
    wait_until(lambda: "fake" in page.inner_text("#status"), 30, "the health poll")
    status = page.inner_text("#status")
    assert "not signed in" in status and "disconnected" not in status
    assert "connecting" not in status
    shot(page, "not-signed-in")
    eve.sign_in("eve")
    assert "not signed in" not in page.inner_text("#status")
    eve.close()


def test_an_open_server_does_not_ask_for_a_token(browser, fake_server):
    """A server without users takes any name: the token field is not shown."""
    assert fake_server.server.admission.access.requires_tokens is False
    fay = Person.open(browser, fake_server, None)
    page = fay.page
    page.wait_for_selector("#signin[open]")
    assert not page.is_visible("#signin-token")
    assert not page.is_visible("#signin-token-row")
    shot(page, "open-server-sign-in")
    fay.sign_in("fay")
    fay.close()


def test_a_token_server_asks_for_the_token_and_refuses_a_wrong_one(browser, fake_server):
    admission = fake_server.server.admission
    old = admission.access
    admission.access = Access({"dave": "dave-secret-token"})
    try:
        dave = Person.open(browser, fake_server, None)
        page = dave.page
        page.wait_for_selector("#signin[open]")
        assert page.is_visible("#signin-token")  # the server needs tokens: the page asks
        hint = page.inner_text("#signin-token-row")
        assert "Only needed when this server has users" in hint
        shot(page, "token-server-sign-in")
        dave.sign_in("dave", "wrong-token-123", ready=False)
        page.wait_for_selector("#signin[open]")
        assert "wrong token" in page.inner_text("#signin-why")
        assert page.is_disabled("#input")
        dave.sign_in("dave", "dave-secret-token")
        assert "token" not in page.url and "secret" not in page.url
        stored = page.evaluate("localStorage.getItem('localserve.v1.identity')")
        assert json.loads(stored) == {"user": "dave", "token": "dave-secret-token"}
        dave.say("hello")
        dave.wait_reply("done", timeout=60)
        dave.problems = [p for p in dave.problems if "WebSocket" not in p]  # the refused one
        dave.close()
    finally:
        admission.access = old


# --- with the real model ------------------------------------------------------------------------


@pytest.mark.model
def test_two_people_stream_at_the_same_time(browser, live):
    people = [Person.open(browser, live, name) for name in ("erin", "frank")]
    for person in people:
        person.settings(temperature=0, max_tokens=120)  # long enough to overlap, on any machine
        person.say(LONG_PROMPT)

    def both_streaming():
        return all(p.reply_status() == "streaming" and p.reply().inner_text() for p in people)

    wait_until(both_streaming, 120, "both replies streaming at once")
    for person in people:
        person.wait_reply("done")
        meta = person.reply().locator(".meta").inner_text()
        assert "TTFT" in meta and "ITL" in meta and "tok/s" in meta, meta
        assert "120 tokens" in meta
        assert person.reply().locator(".body").inner_html().strip()  # " 1. 2. 3." is a list
        person.close()
    live.wait_idle()


def test_queue_position_then_stop_frees_the_cells(browser, scripted):
    """Both of the server's places taken and one request waiting: the page says "2nd in
    line"; once it runs, Stop ends it as cancelled and its cells are freed. (Replies that take
    real time are what this needs, not the model: the paced fake, two slots.)"""
    from localserve.bench.blocking_ws import WS

    reply = ["word "] * 2000
    live = scripted(reply, ScriptedRunner(n_ctx=4096, n_seq_max=2, step_s=0.02, reply=reply))
    fillers = [WS(live.url), WS(live.url)]
    assert fillers[0].hello("fill-a")["type"] == "welcome"
    assert fillers[1].hello("fill-b")["type"] == "welcome"
    slots = 2
    for i in range(slots):
        fillers[0].chat(f"a{i}", "Tell me about the sea.", max_tokens=2000, ignore_eos=True)
    fillers[1].chat("b0", "Tell me about the sea.", max_tokens=2000, ignore_eos=True)
    wait_until(
        lambda: (s := live.snapshot()).running == slots and s.waiting == 1, 60, "a full server"
    )
    grace = Person.open(browser, live, "grace")
    grace.settings(temperature=0, max_tokens=1000)
    grace.say(LONG_PROMPT)
    position = grace.reply().locator(".position")
    position.wait_for(timeout=30_000)
    assert "2nd in line" in position.inner_text()
    for ws in fillers:
        ws.close()  # their requests are cancelled: grace's runs
    grace.wait_reply("streaming")
    grace.page.click("#stop")
    grace.wait_reply("stopped")
    meta = grace.reply().locator(".meta").inner_text()
    assert "stopped" in meta and "TTFT" in meta
    assert grace.page.is_visible("#send") and not grace.page.is_visible("#stop")
    snap = live.wait_idle()  # no running request, no live cells: grace's were freed
    assert snap.kv_live == 0
    grace.close()


def test_a_busy_server_says_so_and_retry_sends_again(browser, scripted):
    from localserve.bench.blocking_ws import WS

    server = scripted(["word "] * 150, max_inflight_per_user=1)
    other_tab = WS(server.url)  # henry's other client has his one request in flight
    assert other_tab.hello("henry")["type"] == "welcome"
    other_tab.chat("t", "a long one", max_tokens=200)
    henry = Person.open(browser, server, "henry")
    henry.say("and one more")
    henry.wait_reply("error", timeout=30)
    meta = henry.reply().locator(".meta")
    assert "The server is busy: 1 requests of yours are already in flight" in meta.inner_text()
    other_tab.until_done("t", timeout=60)
    other_tab.close()
    meta.locator(".retry").click()
    henry.wait_reply("done", timeout=60)
    assert henry.page.locator(".msg.assistant").count() == 1  # the retry replaced the failure
    henry.close()


def test_a_stopping_server_is_announced_and_the_page_tries_again(browser):
    server = FakeServer(runner=ScriptedRunner(reply=["Hi."]))
    try:
        ivy = Person.open(browser, server, "ivy")
        ivy.say("hello")
        ivy.wait_reply("done", timeout=30)
    finally:
        server.close()  # graceful: a notice, then the going-away close
    notice = ivy.page.locator("#notice")
    wait_until(lambda: "trying again" in notice.inner_text(), 30, "the reconnect banner")
    assert ivy.page.is_disabled("#input")
    ivy.problems = [p for p in ivy.problems if "WebSocket" not in p and "Failed to load" not in p]
    ivy.close()


def test_two_tabs_keep_both_conversations(browser, scripted):
    server = scripted(["Fine."])
    tab1 = Person.open(browser, server, "jo")
    tab2 = Person.open(browser, server, None, context=tab1.page.context)  # signed in already
    tab2.page.wait_for_selector("#input:not([disabled])")
    tab1.say("from the first tab")
    tab1.wait_reply("done")
    wait_until(lambda: tab2.chat_titles() == ["from the first tab"], 30, "tab 2 hears of it")
    tab2.page.click("#new-chat")
    tab2.say("from the second tab")
    tab2.wait_reply("done")
    tab1.page.reload()
    tab1.page.wait_for_selector("#input:not([disabled])")
    assert sorted(tab1.chat_titles()) == ["from the first tab", "from the second tab"]
    tab2.page.close()
    tab1.close()


def test_a_shared_browser_shows_each_name_only_its_own_conversations(browser, fake_server):
    admission = fake_server.server.admission
    old = admission.access
    admission.access = Access({"kim": "kim-secret-token", "lee": "lee-secret-token"})
    try:
        kim = Person.open(browser, fake_server, "kim", "kim-secret-token")
        kim.say("kim's secret plans")
        kim.wait_reply("done", timeout=60)
        page = kim.page
        page.click("#who")
        kim.sign_in("lee", "lee-secret-token")
        wait_until(lambda: kim.chat_titles() == [], 30, "lee sees none of kim's")
        kim.say("lee's question")
        kim.wait_reply("done", timeout=60)
        page.click("#who")
        kim.sign_in("kim", "a-wrong-token", ready=False)  # lee tries kim's name
        page.wait_for_selector("#signin[open]")
        assert "wrong token" in page.inner_text("#signin-why")
        page.keyboard.press("Escape")  # no way back to a page without a live connection
        assert page.is_visible("#signin")
        assert kim.chat_titles() == ["lee's question"]  # never kim's
        assert "kim's secret" not in page.inner_text("body")
        stored = json.loads(page.evaluate("localStorage.getItem('localserve.v1.identity')"))
        assert stored == {"user": "lee", "token": "lee-secret-token"}  # the refused one not kept
        kim.problems = [p for p in kim.problems if "WebSocket" not in p]
        kim.close()
    finally:
        admission.access = old


def test_the_page_tells_a_user_about_their_quota(browser, scripted, tmp_path):
    """Used up: said once on the reply, no Retry, and no sending until the reset, whose time the
    composer shows; a reload is still blocked, and at the reset the composer is back."""
    server = scripted(["word "] * 20, state_dir=str(tmp_path), daily_tokens_per_user={"max": 15})
    max_ = Person.open(browser, server, "max")
    page = max_.page
    notice = page.locator("#notice")
    assert "Today: 0 of your 15 tokens used, 15 left (resets at" in notice.inner_text()
    page.clock.install()  # its own clock from here on: to jump to the reset below
    page.reload()
    page.wait_for_selector("#input:not([disabled])")
    max_.say("one two three")
    max_.wait_reply("done")
    max_.say("and more")
    max_.wait_reply("error")
    meta = max_.reply().locator(".meta")
    assert meta.inner_text() == "Not sent: your daily quota of 15 tokens is used up (15 today)."
    assert meta.locator(".retry").count() == 0
    assert page.inner_text("body").count("used up") == 1 and not page.is_visible("#notice")
    assert page.is_disabled("#input") and page.is_disabled("#send")
    waiting = page.get_attribute("#input", "placeholder")
    resets = page.evaluate("""() => { const d = new Date(); d.setHours(24, 0, 0, 0);
        return d.toTimeString().slice(0, 5); }""")  # the server's midnight, on the same machine
    assert waiting.startswith(f"You can send again at {resets} (in ")
    assert waiting.endswith("min), when your daily quota resets.")
    shot(page, "quota-used-up")
    page.reload()  # the welcome says none is left: still no sending
    wait_until(lambda: "0 left" in notice.inner_text(), 30, "the welcome's quota line")
    assert page.is_disabled("#input")
    again = page.get_attribute("#input", "placeholder")  # the minutes may have ticked on
    assert again.split(" (in ")[0] == waiting.split(" (in ")[0]
    page.clock.fast_forward("25:00:00")
    page.wait_for_selector("#input:not([disabled])")
    assert page.get_attribute("#input", "placeholder").startswith("Message (Enter sends")
    max_.close()


# --- conversations on the server ----------------------------------------------------------------

FAMILY = {"ann": "ann-secret-token", "ben": "ben-secret-token"}


def saved(person: Person) -> None:
    """Wait until the server has every conversation of this page (none marked unsaved)."""
    page = person.page
    wait_until(lambda: page.locator("#chat-list li.unsaved").count() == 0, 30, "saved")


def test_conversations_follow_the_person_to_another_browser(browser, scripted, tmp_path):
    """Two browsers (contexts: no shared storage) signed in as ann see one list; a change in
    one shows in the other; ben, on the same server, sees none of it."""
    server = scripted(["Boil ", "water."], access=Access(FAMILY), state_dir=str(tmp_path))
    laptop = Person.open(browser, server, "ann", FAMILY["ann"])
    assert "kept on this server, for you only" in laptop.page.inner_text("#messages")
    laptop.say("How do I make soup?")
    laptop.wait_reply("done")
    saved(laptop)
    phone = Person.open(browser, server, "ann", FAMILY["ann"], viewport=PHONE)
    wait_until(lambda: phone.chat_titles() == ["How do I make soup?"], 30, "the phone's list")
    wait_until(lambda: phone.page.locator(".msg.assistant").count() == 1, 30, "its messages")
    assert phone.reply().locator(".body").inner_text() == "Boil water."
    assert phone.page.inner_text(".msg.user") == "How do I make soup?"
    shot(phone.page, "conversation-on-the-phone")
    phone.page.click("#chats-toggle")
    phone.page.click("#new-chat")
    phone.say("And bread?")
    phone.wait_reply("done")
    saved(phone)
    wait_until(
        lambda: sorted(laptop.chat_titles()) == ["And bread?", "How do I make soup?"],
        30,
        "the laptop hears of the phone's chat",
    )
    laptop.page.click("#rename")  # the open conversation: soup
    laptop.page.fill("#chat-title-input", "Soup, simply")
    laptop.page.press("#chat-title-input", "Enter")
    wait_until(lambda: "Soup, simply" in phone.chat_titles(), 30, "the rename on the phone")
    shot(laptop.page, "conversation-renamed")
    ben = Person.open(browser, server, "ben", FAMILY["ben"])
    ben.page.wait_for_selector("#input:not([disabled])")
    assert ben.chat_titles() == [] and "soup" not in ben.page.inner_text("body").lower()
    phone.page.click("#chats-toggle")  # a drawer on a phone
    delete = phone.page.locator("#chat-list li", has_text="And bread?").locator(".delete")
    delete.click()  # the first click asks
    delete.click()
    wait_until(lambda: laptop.chat_titles() == ["Soup, simply"], 30, "the delete on the laptop")
    laptop.page.reload()  # and what the server keeps, after a reload
    wait_until(lambda: laptop.chat_titles() == ["Soup, simply"], 30, "the list again")
    stored = laptop.page.evaluate("Object.keys(localStorage).filter(k => k.includes('.chat.'))")
    assert stored == []  # nothing of it in the browser
    for person in (laptop, phone, ben):
        person.close()


def test_a_conversation_exports_as_markdown_and_json(browser, scripted, tmp_path):
    server = scripted(["It is **Paris**."], access=Access(FAMILY), state_dir=str(tmp_path))
    ann = Person.open(browser, server, "ann", FAMILY["ann"])
    ann.say("Capital of France?")
    ann.wait_reply("done")
    page = ann.page
    with page.expect_download() as got:
        page.click("#export-md")
    markdown = Path(got.value.path()).read_text(encoding="utf-8")
    assert got.value.suggested_filename == "Capital-of-France.md"
    assert markdown.startswith("# Capital of France?\n\n_ann with fake, started ")
    assert "\n## ann\n\nCapital of France?\n\n## fake\n\nIt is **Paris**.\n" in markdown
    with page.expect_download() as got:
        page.click("#export-json")
    exported = json.loads(Path(got.value.path()).read_text(encoding="utf-8"))
    assert exported["title"] == "Capital of France?" and exported["user"] == "ann"
    assert [(m["role"], m["content"]) for m in exported["messages"]] == [
        ("user", "Capital of France?"),
        ("assistant", "It is **Paris**."),
    ]
    assert exported["messages"][1]["usage"]["completion_tokens"] >= 1  # its figures too
    ann.close()


def test_this_browsers_conversations_move_to_the_server(browser, scripted, tmp_path):
    """A person who chatted before the server had users finds those conversations kept."""
    server = scripted(["Yes."], access=Access(FAMILY), state_dir=str(tmp_path))
    ann = Person.open(browser, server, None)
    old = {
        "id": "cold1",
        "title": "An old chat",
        "created": 1_700_000_000_000,
        "messages": [
            {"role": "user", "content": "from before"},
            {"role": "assistant", "content": "kept", "status": "done"},
        ],
    }
    ann.page.evaluate(
        "(chat) => localStorage.setItem('localserve.v1.chat.ann.cold1', JSON.stringify(chat))", old
    )
    ann.sign_in("ann", FAMILY["ann"])
    notice = ann.page.locator("#notice")
    wait_until(lambda: "kept in this browser to the server" in notice.inner_text(), 30, "the move")
    saved(ann)
    assert ann.page.evaluate("localStorage.getItem('localserve.v1.chat.ann.cold1')") is None
    other = Person.open(browser, server, "ann", FAMILY["ann"])
    wait_until(lambda: other.chat_titles() == ["An old chat"], 30, "kept on the server")
    ann.close()
    other.close()


@pytest.mark.model
def test_a_killed_server_loses_no_saved_conversation_in_the_page(browser, tmp_path):
    """SIGKILL mid-reply: the conversation the page saved (the question, the reply coming) is
    there when the server is back, in another browser; the reply says it was cut."""
    users = {"LOCALSERVE_USERS": "ann:" + FAMILY["ann"]}
    proc, url = start_serve(tmp_path, users)
    try:
        where = Where(url.replace("ws://", "http://"))
        ann = Person.open(browser, where, "ann", FAMILY["ann"])
        ann.settings(0, 400)
        ann.say(LONG_PROMPT)
        ann.wait_reply("streaming", timeout=60)
        saved(ann)
    finally:
        kill_serve(proc)
    proc, url = start_serve(tmp_path, users)
    try:
        where = Where(url.replace("ws://", "http://"))
        again = Person.open(browser, where, "ann", FAMILY["ann"])
        wait_until(lambda: again.chat_titles() == [LONG_PROMPT[:60]], 60, "the conversation")
        wait_until(lambda: again.page.locator(".msg.user").count() == 1, 30, "its messages")
        assert again.page.inner_text(".msg.user") == LONG_PROMPT
        assert again.reply_status() == "interrupted"
        assert "still coming when it was last saved" in again.reply().inner_text()
        again.close()
        gone = ("WebSocket", "Failed to load")  # the page saw its server go
        ann.problems = [p for p in ann.problems if not any(g in p for g in gone)]
        ann.close()
    finally:
        kill_serve(proc)


@dataclass
class Where:
    """A server's address, for a server run as a process of its own."""

    http: str


def test_two_devices_changing_one_conversation_lose_nothing(browser, scripted, tmp_path):
    """The laptop's reply is still coming when the phone adds a turn to the same conversation:
    the laptop's copy, saved after the phone's, is kept as a conversation of its own."""
    server = scripted(["word "] * 150, access=Access(FAMILY), state_dir=str(tmp_path))
    laptop = Person.open(browser, server, "ann", FAMILY["ann"])
    laptop.say("Tell me a long story")
    laptop.wait_reply("streaming")
    saved(laptop)
    phone = Person.open(browser, server, "ann", FAMILY["ann"])
    wait_until(lambda: phone.page.locator(".msg.user").count() == 1, 30, "the phone opens it")
    assert "still coming when it was last saved" in phone.reply().inner_text()
    phone.say("Shorter, please")
    wait_until(lambda: phone.page.locator(".msg.user").count() == 2, 30, "the phone's turn")
    laptop.wait_reply("done")
    mine = "Tell me a long story (this device)"
    wait_until(lambda: sorted(laptop.chat_titles()) == ["Tell me a long story", mine], 30, "a copy")
    assert "was changed on another device meanwhile" in laptop.page.inner_text("#notice")
    assert laptop.reply().locator(".body").inner_text().startswith("word word")  # its reply
    saved(laptop)
    wait_until(lambda: mine in phone.chat_titles(), 30, "the phone hears of the copy")
    phone.wait_reply("done")
    assert phone.page.locator(".msg.user").nth(1).inner_text() == "Shorter, please"  # kept
    laptop.close()
    phone.close()


def terminal_chat(server, user: str, *lines: str) -> str:
    """`localserve chat` (tui/chat.py) typing `lines`, on a thread of its own (Playwright's sync
    API keeps this one); what it printed."""
    import asyncio
    import io
    import threading

    from tui.chat import ChatClient

    async def typed():
        for line in lines:
            yield line

    out = io.StringIO()
    client = ChatClient(server.url, user, FAMILY[user], temperature=0, lines=typed(), out=out)
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(asyncio.run(client.run())))
    thread.start()
    thread.join(60)
    assert status == [0], out.getvalue()
    return out.getvalue()


def test_the_page_and_the_terminal_chat_go_on_with_each_others_conversations(
    browser, scripted, tmp_path
):
    """A conversation started in the page is resumed in `localserve chat`; the page, open on
    it, shows the terminal's turn; the terminal's own new conversation is in the page's list."""
    server = scripted(["Boil ", "water."], access=Access(FAMILY), state_dir=str(tmp_path))
    ann = Person.open(browser, server, "ann", FAMILY["ann"])
    ann.say("How do I make soup?")
    ann.wait_reply("done")
    saved(ann)
    printed = terminal_chat(server, "ann", "/resume 1", "And then?", "/new", "Tea, please")
    assert "model> Boil water." in printed and "(resumed “How do I make soup?”" in printed
    wait_until(lambda: ann.page.locator(".msg.assistant").count() == 2, 30, "the terminal's turn")
    assert ann.page.locator(".msg.user").nth(1).inner_text() == "And then?"
    assert ann.reply().locator(".body").inner_text() == "Boil water."
    assert ann.reply_status() == "done" and "prompt " in ann.reply().locator(".meta").inner_text()
    wait_until(
        lambda: sorted(ann.chat_titles()) == ["How do I make soup?", "Tea, please"], 30, "its list"
    )
    ann.say("And salt?")  # the page goes on after the terminal's turn
    ann.wait_reply("done")
    saved(ann)
    printed = terminal_chat(server, "ann", "/chats", "/resume 2")
    assert "you> And salt?\nmodel> Boil water." in printed
    ann.close()


def test_a_conversation_deleted_while_its_reply_comes_stays_deleted(browser, scripted, tmp_path):
    server = scripted(["word "] * 150, access=Access(FAMILY), state_dir=str(tmp_path))
    ann = Person.open(browser, server, "ann", FAMILY["ann"])
    ann.say("Soon to be deleted")
    ann.wait_reply("streaming")
    saved(ann)
    delete = ann.page.locator("#chat-list li", has_text="Soon to be deleted").locator(".delete")
    delete.click()
    delete.click()
    assert ann.chat_titles() == []
    server.wait_idle()
    ann.page.reload()
    ann.page.wait_for_selector("#input:not([disabled])")
    assert ann.chat_titles() == []  # its end saved nothing back
    ann.close()


def test_at_the_bound_a_conversation_is_kept_here_until_there_is_room(browser, scripted, tmp_path):
    server = scripted(
        ["Ok."], access=Access(FAMILY), state_dir=str(tmp_path), max_conversations_per_user=1
    )
    ann = Person.open(browser, server, "ann", FAMILY["ann"])
    ann.say("the first")
    ann.wait_reply("done")
    saved(ann)
    ann.page.click("#new-chat")
    ann.say("one too many")
    ann.wait_reply("done")
    notice = ann.page.locator("#notice")
    wait_until(lambda: "is not saved on the server" in notice.inner_text(), 30, "the refusal")
    assert "as many as it keeps for one person: delete old ones" in notice.inner_text()
    assert ann.page.locator("#chat-list li.unsaved").inner_text().startswith("one too many")
    shot(ann.page, "conversation-not-saved")
    ann.page.reload()  # kept in this browser meanwhile
    ann.page.wait_for_selector("#input:not([disabled])")
    wait_until(lambda: sorted(ann.chat_titles()) == ["one too many", "the first"], 30, "both")
    delete = ann.page.locator("#chat-list li", has_text="the first").locator(".delete")
    delete.click()
    delete.click()
    saved(ann)  # room now: saved
    assert not ann.page.is_visible("#notice")  # and the refusal is no longer said
    other = Person.open(browser, server, "ann", FAMILY["ann"])
    wait_until(lambda: other.chat_titles() == ["one too many"], 30, "on the server")
    other.close()
    ann.close()


def test_a_chat_longer_than_the_context_says_its_oldest_messages_were_left_out(browser):
    """The server drops a long chat's oldest turns (context_overflow = "truncate"); the reply
    says so in a note under it, and a chat that fits has none."""
    runner = ScriptedRunner(n_ctx=256, n_seq_max=8, step_s=0.01, reply=["Sure."])
    server = FakeServer(runner=runner)
    try:
        dora = Person.open(browser, server, "dora")
        dora.settings(0, 32)
        for turn in range(4):  # about 65 tokens a turn: the fourth fits with 32 more once the
            # first turn (its question and its reply) is left out
            dora.say(f"question {turn}: " + "word " * 60)
            wait_until(lambda n=turn: dora.page.locator(".msg.assistant").count() == n + 1, 30)
            dora.wait_reply("done")
            note = dora.reply().locator(".meta .dropped")
            assert note.count() == (1 if turn == 3 else 0), turn
        assert note.inner_text() == (
            "the 2 oldest messages were left out: the chat is longer than the model's context"
        )
        dora.close()
    finally:
        server.close()


THOUGHT = "First <b>a</b> thought.\nThen another, rather longer one " + "x" * 200 + "."
THINKING_REPLY = ["<think>", "\n", *[w + " " for w in THOUGHT.split(" ")], "\n</think>", "\n\n"]


def test_reasoning_shows_folded_apart_from_the_answer_and_is_never_sent_back(
    browser, scripted, tmp_path
):
    """A thinking model's reasoning (the token frames' `reasoning`: a scripted reply on a
    runner whose template shows `<think>`) streams into a "Thinking…" fold above the answer,
    as plain text; the fold closes when the answer starts. It is kept with the conversation on
    the server (a reload and a phone show it) and the next turn sends only the answer."""
    pieces = [*THINKING_REPLY, "The ", "answer ", "is ", "**4**."]
    runner = ScriptedRunner(  # step_s: the thinking takes a second or two
        n_ctx=4096, n_seq_max=8, step_s=0.05, reply=pieces, template_source="<think>"
    )
    server = scripted(pieces, access=Access(FAMILY), state_dir=str(tmp_path), runner=runner)
    ann = Person.open(browser, server, "ann", FAMILY["ann"])
    page = ann.page
    sent: list[dict] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda f: sent.append(json.loads(f))))
    page.reload()  # the connection opens again, watched
    page.wait_for_selector("#input:not([disabled])")
    ann.say("What is 2 + 2?")
    fold = ann.reply().locator("details.reasoning")
    page.wait_for_selector(".msg.assistant details.reasoning[open]")
    assert fold.locator("summary").inner_text() == "Thinking…"
    shot(page, "reasoning-streaming")
    ann.wait_reply("done")
    assert fold.get_attribute("open") is None  # folded once the answer came
    assert fold.locator("summary").inner_text().startswith("Thought for ")
    assert ann.reply().locator(".body").inner_text() == "The answer is 4."
    assert ann.reply().locator(".body strong").inner_text() == "4"  # the answer is Markdown
    text = fold.locator(".text")
    assert text.evaluate("(t) => t.children.length") == 0  # the reasoning is text, never HTML
    assert text.evaluate("(t) => t.textContent").strip() == THOUGHT
    assert ann.reply().evaluate("(m) => m.firstElementChild.tagName") == "DETAILS"  # above it
    fold.locator("summary").click()
    assert fold.get_attribute("open") is not None
    shot(page, "reasoning-open")
    saved(ann)
    page.reload()  # kept on the server
    page.wait_for_selector(".msg.assistant details.reasoning")
    assert fold.get_attribute("open") is None
    assert fold.locator("summary").inner_text() == "Reasoning"
    assert text.evaluate("(t) => t.textContent").strip() == THOUGHT
    ann.say("And 3 + 3?")
    wait_until(lambda: page.locator(".msg.assistant").count() == 2, 30, "a second reply")
    ann.wait_reply("done")
    [*_, second] = [f for f in sent if f.get("type") == "chat"]
    assert second["messages"] == [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "The answer is **4**."},
        {"role": "user", "content": "And 3 + 3?"},
    ]
    saved(ann)
    phone = Person.open(browser, server, "ann", FAMILY["ann"], viewport=PHONE)
    wait_until(lambda: phone.page.locator(".msg.assistant").count() == 2, 30, "its messages")
    phone.page.locator("details.reasoning summary").first.click()
    wide = phone.page.evaluate("""() => {
        const d = document.documentElement, m = document.getElementById('messages');
        return [d.scrollWidth - d.clientWidth, m.scrollWidth - m.clientWidth];
    }""")
    assert wide == [0, 0]
    shot(phone.page, "reasoning-on-the-phone")
    ann.close()
    phone.close()


# --- picking a model (issue 38) ------------------------------------------------------------------

TWO_MODELS = """
[server]
max_loaded_models = 1  # the second model's load is a swap

[models.gemma]
embedded = true
chat_format = "transcript"
chat_template = "gemma"
n_ctx = 2048
max_num_seqs = 4

[models.twin]  # the same GGUF under another name
path = "{gguf}"
chat_format = "transcript"
chat_template = "gemma"
n_ctx = 1024
max_num_seqs = 2
"""


def picker_options(page) -> list[str]:
    return page.locator("#model-pick option").all_inner_texts()


def watch_for(page, selector: str):
    """Whether an element matching `selector` has been in the page since this call, however
    briefly: a MutationObserver notes it (a poll may miss a state that lasts a moment on a busy
    machine)."""
    page.evaluate(
        """(selector) => {
            const seen = (window.seenSelectors = window.seenSelectors || {});
            const look = () => { if (document.querySelector(selector)) seen[selector] = true; };
            look();
            new MutationObserver(look).observe(document.body, { childList: true, subtree: true });
        }""",
        selector,
    )
    return lambda: page.evaluate("(s) => !!(window.seenSelectors || {})[s]", selector)


def answered_by(state: Path, user: str) -> list[str]:
    """The models of the user's requests in the server's usage record, in order."""
    import sqlite3

    from localserve.ops.usage_database import DATABASE

    db = sqlite3.connect(state / DATABASE)
    try:
        return [m for (m,) in db.execute("SELECT model FROM requests WHERE user = ?", (user,))]
    finally:
        db.close()


def test_the_picker_on_fake_models_shows_costs_loading_and_who_answered(
    browser, fake_server, tmp_path, monkeypatch
):
    """The page's side on fake engines (no model needed): one model, no picker; two, the
    picker, the load seen, the reply's model, and the choice kept in this browser."""
    only_one = Person.open(browser, fake_server, "solo")
    assert only_one.page.locator("#model-row").is_hidden()
    only_one.close()
    # a load long enough that the page renders it even when its frames come late and together
    with two_fake_models(tmp_path, monkeypatch, load_s=2.0) as served:
        where = Where(served.thread.http)
        ann = Person.open(browser, where, "ann", viewport=PHONE)
        page = ann.page
        wait_until(lambda: "second — needs a swap" in picker_options(page)[1], 30, "the costs")
        assert page.locator("#messages .empty").inner_text().startswith("Ask first anything")
        page.select_option("#model-pick", "second")
        # the empty conversation and the phone's status line name the model picked
        wait_until(
            lambda: page.locator("#messages .empty").inner_text().startswith("Ask second "),
            10,
            "the empty conversation names the model picked",
        )
        assert page.locator("#status").inner_text().split()[:1] == ["second"], page.locator(
            "#status"
        ).inner_text()
        seen_loading = watch_for(page, ".msg.assistant .meta .loading")  # however briefly
        ann.say("Hello")
        ann.wait_reply("done", "stopped")
        assert seen_loading(), "the reply did not show its model loading"
        assert ann.reply().locator(".meta .model").inner_text() == "second"
        shot(page, "model-picker-fake-phone")
        page.reload()
        page.wait_for_selector("#input:not([disabled])")
        assert page.input_value("#model-pick") == "second"
        ann.close()


@pytest.mark.model
def test_a_conversation_picks_a_second_model_sees_it_load_and_keeps_it(browser, tmp_path):
    from localserve.runners.models import ensure_embedded

    toml = tmp_path / "models.toml"
    toml.write_text(TWO_MODELS.format(gguf=ensure_embedded()))
    env = {"LOCALSERVE_MODELS": str(toml), "LOCALSERVE_USERS": "ann:" + FAMILY["ann"]}
    proc, url = start_serve(tmp_path, env)
    try:
        where = Where(url.replace("ws://", "http://"))
        ann = Person.open(browser, where, "ann", FAMILY["ann"])
        page = ann.page
        page.wait_for_selector("#model-row:not([hidden])")
        wait_until(lambda: "twin — needs a swap" in picker_options(page)[1], 30, "the costs")
        assert picker_options(page)[0] == "gemma (default) — loaded"
        assert page.input_value("#model-pick") == "gemma"
        page.select_option("#model-pick", "twin")
        ann.settings(0, 8)
        ann.say("Hello")
        page.wait_for_selector(".msg.assistant .meta .loading", timeout=60_000)
        assert "loading model twin" in ann.reply().locator(".meta").inner_text()
        wait_until(lambda: "twin — loading…" in picker_options(page), 30, "the picker: loading")
        ann.wait_reply("done")
        assert ann.reply().locator(".meta .model").inner_text() == "twin"
        assert answered_by(tmp_path, "ann") == ["twin"]  # the server's record says so too
        wait_until(
            lambda: "gemma (default) — needs a swap" in picker_options(page)[0], 30, "swapped"
        )
        saved(ann)
        page.reload()
        page.wait_for_selector("#input:not([disabled])")
        wait_until(lambda: page.locator(".msg.assistant").count() == 1, 30, "its messages")
        assert page.input_value("#model-pick") == "twin"
        assert ann.reply().locator(".meta .model").inner_text() == "twin"
        ann.say("And again")  # the next turn goes to the conversation's model
        ann.wait_reply("done")
        assert answered_by(tmp_path, "ann") == ["twin", "twin"]
        ann.close()
        phone = Person.open(browser, where, "ann", FAMILY["ann"], viewport=PHONE)
        phone.page.wait_for_selector("#model-row:not([hidden])")
        wait_until(lambda: phone.page.input_value("#model-pick") == "twin", 30, "on the phone")
        width = phone.page.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE["width"], "the picker makes the phone scroll sideways"
        shot(phone.page, "model-picker-phone")
        phone.close()
    finally:
        kill_serve(proc)


def test_a_waiting_reply_shows_its_place_and_counts_its_predicted_wait_down(browser, scripted):
    """One slot, held by another person's reply of 300 tokens: the page's reply waits, says its
    place and the server's predicted wait, and counts it down between the server's updates
    (issue 40); on a phone too."""
    from localserve.bench.blocking_ws import WS

    reply = ["word "] * 300  # 4.5 s a reply: it still holds the slot on a slow machine
    server = scripted(reply, ScriptedRunner(n_ctx=4096, n_seq_max=1, step_s=0.015, reply=reply))
    judy = Person.open(browser, server, "judy", viewport=PHONE)  # ready before the slot is held
    judy.settings(temperature=0, max_tokens=20)  # her own reply is short
    other = WS(server.url)
    assert other.hello("ivan")["type"] == "welcome"
    other.chat("warm", "teach the server how long a reply is", max_tokens=1000)
    other.until_done("warm")
    other.chat("long", "and another", max_tokens=1000)
    wait_until(lambda: server.snapshot().running == 1, 30, "ivan's reply running")
    judy.say("my turn?")
    countdown = judy.reply().locator(".countdown")
    countdown.wait_for(timeout=30_000)
    first = countdown.inner_text()
    assert judy.reply().locator(".position").inner_text() == "waiting · 1st in line", first
    shot(judy.page, "waiting-countdown-phone")
    seconds = int(first.split()[1])
    assert first == f"about {seconds} s" and seconds >= 2
    wait_until(lambda: countdown.inner_text() != first, 15, "the countdown moving")
    assert int(countdown.inner_text().split()[1]) < seconds  # counted down, not up
    judy.wait_reply("done")
    assert "queued" in judy.reply().locator(".meta").inner_text()
    assert not judy.problems, judy.problems
    other.close()
    judy.close()
