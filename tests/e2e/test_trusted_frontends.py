"""People behind a trusted front-end (localserve/serve/trusted_proxies.py): Open WebUI's requests,
replayed as it sends them, against the real server and model on loopback.

What Open WebUI sends, from its source (open-webui/open-webui):
- backend/open_webui/routers/openai.py, get_headers_and_cookies: Content-Type, `Authorization:
  Bearer <the connection's key>`, and with ENABLE_FORWARD_USER_INFO_HEADERS the user's
  `X-OpenWebUI-User-Name: quote(user.name, safe=" ")`, `-Id` (a UUID), `-Email`, `-Role` and
  `X-OpenWebUI-Chat-Id`; generate_chat_completion posts the chat's model, messages, `stream:
  true` and `stream_options: {"include_usage": true}` to <base>/chat/completions;
- backend/open_webui/routers/ollama.py: the same user headers (utils/headers.py,
  include_user_info_headers) on a POST of model, messages, stream and options to /api/chat.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import tempfile
import threading
import urllib.parse
from pathlib import Path
from urllib.parse import quote

import msgspec
import pytest

from localserve.ops import usage_database
from localserve.ops.auth import Access
from localserve.ops.people import DATABASE as PEOPLE
from localserve.ops.people import PeopleStore
from localserve.ops.usage import Usage
from localserve.serve.trusted_proxies import People
from tests.support.live import configured
from tests.support.waiting import wait_until

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m"
KEY = "owui-connection-key"  # the key entered in Open WebUI's connection settings
KATE = "kates-own-token"
ALICE = ("Alice", "5d0f8a52-6b1e-4c1f-9d6e-1a2b3c4d5e01")
BOB = ("Bob", "7e1a9b63-7c2f-4d20-8e7f-2b3c4d5e6f02")
USERS = {"openwebui": KEY, "kate": KATE}


def owui_headers(person: tuple[str, str], key: str = KEY, chat: str = "chat-1") -> dict:
    """Open WebUI's headers to a backend, as get_headers_and_cookies builds them."""
    name, uid = person
    return {
        "Content-Type": "application/json",
        "X-OpenWebUI-User-Name": quote(name, safe=" "),
        "X-OpenWebUI-User-Id": uid,
        "X-OpenWebUI-User-Email": f"{name.lower()}@example.org",
        "X-OpenWebUI-User-Role": "user",
        "X-OpenWebUI-Chat-Id": chat,
        "Authorization": f"Bearer {key}",
    }


def openai_body(text: str, **extra) -> dict:
    """generate_chat_completion's payload for a chat from the page (it always streams)."""
    messages = [{"role": "user", "content": text}]
    body = {"model": MODEL, "messages": messages, "stream": True}
    return body | {"stream_options": {"include_usage": True}} | extra


def ollama_body(text: str) -> dict:
    """routers/ollama.py's /api/chat payload."""
    messages = [{"role": "user", "content": text}]
    return {"model": MODEL, "messages": messages, "stream": True, "options": {"num_predict": 6}}


def post(live, path: str, body: dict, headers: dict, timeout: float = 120):
    """A plain HTTP POST: (status, body bytes)."""
    url = urllib.parse.urlsplit(live.http)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    conn.request("POST", path, json.dumps(body).encode(), headers)
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, payload


def get(live, path: str, headers: dict) -> tuple[int, bytes]:
    url = urllib.parse.urlsplit(live.http)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, payload


def stream_usage(payload: bytes) -> dict:
    """The usage chunk of an OpenAI event stream (stream_options.include_usage)."""
    events = [e[len("data: ") :] for e in payload.decode().split("\n\n") if e]
    assert events[-1] == "[DONE]", events[-3:]
    return json.loads(events[-2])["usage"]


def error_of(payload: bytes) -> str:
    error = json.loads(payload)["error"]
    return error["message"] if isinstance(error, dict) else error


@contextlib.contextmanager
def frontend(live, tmp_path=None, **limits):
    """The live server with Open WebUI's key trusted (a fresh registry of people, kept in a
    directory of its own) and, given a directory, a usage record of its own there (its quotas
    from `limits`)."""
    server, admission = live.server, live.server.admission
    kept = tempfile.TemporaryDirectory(prefix="people-")
    store = PeopleStore(Path(kept.name) / PEOPLE)
    old_people, admission.people = admission.people, People(store)
    limits = {"trusted_frontends": ["openwebui"]} | limits
    with configured(live, access=Access(USERS), **limits):
        old_usage = server.usage
        if tmp_path is not None:
            config = msgspec.structs.replace(server.config, state_dir=str(tmp_path))
            server.usage = Usage(config, server.model_name)
        try:
            yield server.usage
        finally:
            live.wait_idle()
            if tmp_path is not None:
                wait_until(lambda: server.router.num_unsent_dones == 0, 30, "dones sent")
                server.usage.close()
                server.usage = old_usage
            admission.people = old_people
            store.close()
            kept.cleanup()


def rows_of(store: Usage, user: str) -> list[usage_database.Row]:
    db = usage_database.connect(store.path, readonly=True)
    try:
        return usage_database.rows_of(db, "user = ?", [user])
    finally:
        db.close()


# --- two people, one key -------------------------------------------------------------------


def test_two_people_through_one_key_get_their_own_usage_rows(live, tmp_path):
    with frontend(live, tmp_path) as store:
        for person in (ALICE, BOB):
            status, payload = post(
                live,
                "/v1/chat/completions",
                openai_body("Say hi.", max_tokens=6),
                owui_headers(person),
            )
            assert status == 200, payload[:200]
            assert stream_usage(payload)["completion_tokens"] > 0
        status, payload = post(live, "/api/chat", ollama_body("Say hi."), owui_headers(ALICE))
        assert status == 200, payload[:200]
        assert json.loads(payload.splitlines()[-1])["done"] is True
        anthropic = {
            "model": MODEL,
            "max_tokens": 6,
            "messages": [{"role": "user", "content": "Hi"}],
        }
        headers = owui_headers(ALICE) | {"Authorization": "", "x-api-key": KEY}
        status, payload = post(live, "/v1/messages", anthropic, headers)
        assert status == 200, payload[:200]
        wait_until(lambda: len(rows_of(store, "openwebui/alice")) == 3, 30, "alice's rows")
        assert {r.api for r in rows_of(store, "openwebui/alice")} == {"http", "ollama", "anthropic"}
        assert len(rows_of(store, "openwebui/bob")) == 1
        assert rows_of(store, "openwebui") == []
        today = {u.user for u in store.quotas.today()}
        assert today == {"openwebui/alice", "openwebui/bob"}


def test_each_person_has_a_quota_of_their_own(live, tmp_path):
    quotas = dict(daily_tokens=400, daily_tokens_per_user={"openwebui/alice": 120})
    with frontend(live, tmp_path, **quotas) as store:
        long_reply = openai_body("Tell me a story.", max_tokens=300, ignore_eos=True)
        status, payload = post(live, "/v1/chat/completions", long_reply, owui_headers(ALICE))
        assert status == 200, payload[:200]
        wait_until(lambda: rows_of(store, "openwebui/alice"), 30, "alice's row")
        status, payload = post(
            live, "/v1/chat/completions", openai_body("Hi."), owui_headers(ALICE)
        )
        assert status == 429 and "daily quota of 120" in error_of(payload)
        short = openai_body("Hi.", max_tokens=6)
        status, payload = post(live, "/v1/chat/completions", short, owui_headers(BOB))
        assert status == 200, payload[:200]  # bob's is the default, untouched by alice's
        assert store.quotas.quota("openwebui/bob").daily_tokens == 400


def test_two_people_stream_at_once_each_under_their_own_cap(live):
    results: dict[str, int] = {}

    def chat(person) -> None:
        body = openai_body("Tell me a story.", max_tokens=200, ignore_eos=True)
        status, payload = post(live, "/v1/chat/completions", body, owui_headers(person))
        results[person[0]] = status

    with frontend(live, max_inflight_per_user=1):
        threads = [threading.Thread(target=chat, args=(p,)) for p in (ALICE, BOB)]
        for t in threads:
            t.start()

        def both_running() -> bool:
            return {s.user for s in live.snapshot().seqs} >= {"openwebui/alice", "openwebui/bob"}

        wait_until(both_running, 60, "alice and bob running together")
        for t in threads:
            t.join(120)
    assert results == {"Alice": 200, "Bob": 200}  # one request each: neither hit the cap of 1


def test_a_persons_cached_prompt_is_not_reused_for_another(live):
    system = {"role": "system", "content": "You answer in one short sentence. " * 30}
    body = openai_body("What is the capital of France?", max_tokens=4)
    body["messages"].insert(0, system)
    with frontend(live):
        cached = []
        for person in (ALICE, ALICE, BOB):
            status, payload = post(live, "/v1/chat/completions", body, owui_headers(person))
            assert status == 200, payload[:200]
            u = stream_usage(payload)
            cached.append(u["prompt_tokens_details"]["cached_tokens"])
            live.wait_idle()
        assert cached[1] > u["prompt_tokens"] / 2, cached  # alice's second reuses her first
        assert cached[2] < cached[1] / 2, cached  # bob's does not get alice's


# --- who may say on whose behalf ----------------------------------------------------------


def test_the_header_from_another_key_or_an_open_server_changes_nothing(live, tmp_path):
    with frontend(live, tmp_path) as store:
        body = openai_body("Say hi.", max_tokens=4)
        status, _ = post(live, "/v1/chat/completions", body, owui_headers(ALICE, key=KATE))
        assert status == 200
        headers = owui_headers(BOB, key=KATE) | {"X-Localserve-User": "bob"}
        assert post(live, "/api/chat", ollama_body("Hi."), headers)[0] == 200
        wait_until(lambda: len(rows_of(store, "kate")) == 2, 30, "kate's rows")
        assert {u.user for u in store.quotas.today()} == {"kate"}
        # without a header the front-end is itself the user
        plain = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        assert post(live, "/v1/chat/completions", body, plain)[0] == 200
        wait_until(lambda: rows_of(store, "openwebui"), 30, "the front-end's own row")
    # an open server: whoever asks is named as before (the `user` field, else the default)
    server = live.server
    old, server.usage = (
        server.usage,
        Usage(
            msgspec.structs.replace(server.config, state_dir=str(tmp_path / "open")),
            server.model_name,
        ),
    )
    try:
        with configured(live, trusted_frontends=["openwebui"]):
            headers = owui_headers(ALICE, key="anything") | {"X-Localserve-User": "alice"}
            named = body | {"user": "openwebui"}  # claiming the front-end's name: no trust
            assert post(live, "/v1/chat/completions", named, headers)[0] == 200
            assert post(live, "/api/chat", ollama_body("Hi."), headers)[0] == 200
            wait_until(lambda: len(server.usage.quotas.today()) == 2, 30, "two rows")
            assert {u.user for u in server.usage.quotas.today()} == {"openwebui", "ollama"}
    finally:
        live.wait_idle()
        server.usage.close()
        server.usage = old


# --- bounds -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "value", "why"),
    [
        ("X-OpenWebUI-User-Name", "a" * 65, "1-64 printable"),
        ("X-OpenWebUI-User-Name", "x" * 1025, "longer than 1024"),
        ("X-OpenWebUI-User-Name", "%07bell", "printable"),
        ("X-OpenWebUI-User-Name", "%ff%fe", "not UTF-8"),
        ("X-OpenWebUI-User-Name", "%20%20", "1-64 printable"),
        ("X-Localserve-User", "del%7Fete", "printable"),
        ("X-OpenWebUI-User-Id", "ü-id", "printable ASCII"),
    ],
)
def test_a_bad_name_is_a_400_naming_the_header(live, header, value, why):
    headers = owui_headers(ALICE) | {header: value}
    with frontend(live):
        status, payload = post(live, "/v1/chat/completions", openai_body("Hi."), headers)
        assert status == 400 and error_of(payload).startswith(header + ":"), payload
        assert why in error_of(payload)
        assert json.loads(payload)["error"]["param"] == header
        status, payload = post(live, "/api/chat", ollama_body("Hi."), headers)
        assert (
            status == 400
            and error_of(payload).startswith(header + ":")
            and why in error_of(payload)
        )
        assert live.server.admission.people.num_people("openwebui") == 0


def test_names_are_normalized_and_an_id_keeps_its_first_name(live):
    with frontend(live):
        people = live.server.admission.people
        headers = owui_headers(("  Ålice   Smith ", ALICE[1]))
        assert get(live, "/v1/models", headers)[0] == 200
        renamed = owui_headers(("Someone Else", ALICE[1]))  # alice renamed herself
        assert get(live, "/api/tags", renamed)[0] == 200
        assert people.num_people("openwebui") == 1
        # bob taking alice's name gets a 403, not her quota or cache
        status, payload = post(
            live, "/v1/chat/completions", openai_body("Hi."), owui_headers(("ålice smith", BOB[1]))
        )
        assert status == 403 and "another account's name" in error_of(payload)
        raw = {"Authorization": f"Bearer {KEY}", "X-Localserve-User": quote("Zoë")}
        assert get(live, "/v1/models", raw)[0] == 200
        assert people.num_people("openwebui") == 2
        assert sorted(people._named["openwebui"].ids) == ["zoë", "ålice smith"]


def test_past_the_bound_a_new_person_is_refused_and_known_ones_go_on(live):
    with frontend(live, max_people_per_frontend=2):
        for person in (ALICE, BOB):
            assert get(live, "/v1/models", owui_headers(person))[0] == 200
        carol = owui_headers(("Carol", "0c0c0c0c-0000-4000-8000-00000000000c"))
        status, payload = post(live, "/v1/chat/completions", openai_body("Hi."), carol)
        assert status == 403 and "max_people_per_frontend" in error_of(payload)
        assert post(live, "/api/chat", ollama_body("Hi."), carol)[0] == 403
        status, payload = post(
            live, "/v1/chat/completions", openai_body("Hi.", max_tokens=4), owui_headers(BOB)
        )
        assert status == 200, payload[:200]
        assert live.server.admission.people.num_people("openwebui") == 2
