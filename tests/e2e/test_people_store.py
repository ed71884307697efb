"""People behind a trusted front-end kept in the state dir (localserve/ops/people.py through
serve/trusted_proxies.py): dave's binding survives a restart of the server and a SIGKILL of a real
`localserve serve` mid-reply; after either, another id that calls itself "dave", or a request
giving the name without an id, is refused while the real dave is still `openwebui/dave`; and a
store that cannot be written refuses new people while the known ones go on; one that is not a
store stops the server at start."""

from __future__ import annotations

import http.client
import json
import sqlite3
import urllib.parse
from pathlib import Path
from types import SimpleNamespace

import pytest

from localserve.bench.fake_server import FakeServer
from localserve.ops.auth import Access
from localserve.ops.people import DATABASE, PeopleUnusable
from localserve.ops.usage_database import DATABASE as USAGE_DATABASE
from tests.support.cli import kill_serve, start_serve
from tests.support.clients import http_request
from tests.support.waiting import wait_until

MODEL = "gemma-3-270m"  # the embedded model, for `localserve serve`
KEY = "owui-connection-key"
USERS = {"openwebui": KEY, "kate": "kates-own-token"}
DAVE = "3f2c9a10-7d4e-4b1a-9c2d-5e6f7a8b9c0d"
MALLORY = "9a8b7c6d-0000-4000-8000-00000000bad0"


def owui(name: str, uid: str | None) -> dict:
    """Open WebUI's headers for a person (the id left out: a request giving the name alone)."""
    headers = {"Authorization": f"Bearer {KEY}", "X-OpenWebUI-User-Name": name}
    return headers | ({"X-OpenWebUI-User-Id": uid} if uid else {})


def chat(server, headers: dict) -> tuple[int, dict]:
    model = getattr(server, "model_name", "fake")  # a `localserve serve` process's, or the fake
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    status, _, payload = http_request(server, "POST", "/v1/chat/completions", body, headers)
    return status, json.loads(payload)


def users_of_rows(state: Path) -> list[str]:
    db = sqlite3.connect(state / USAGE_DATABASE)
    try:
        return [user for (user,) in db.execute("SELECT user FROM requests ORDER BY id")]
    finally:
        db.close()


def kept(state: Path) -> list[tuple]:
    db = sqlite3.connect(state / DATABASE)
    try:
        return list(db.execute("SELECT frontend, name, account FROM people"))
    finally:
        db.close()


def fake_server(state: Path, **config) -> FakeServer:
    return FakeServer(
        access=Access(USERS), state_dir=str(state), trusted_frontends=["openwebui"], **config
    )


def refused_after_a_restart(server) -> None:
    """What a server that knows dave answers whoever else says "dave"."""
    status, error = chat(server, owui("Dave", MALLORY))
    assert status == 403 and "'dave' is another account's name here" in error["error"]["message"]
    assert error["error"]["param"] == "X-OpenWebUI-User-Name"
    status, error = chat(server, owui("dave", None))  # the name alone
    message = error["error"]["message"]
    assert status == 403 and "'dave' is an account's name here: send its X-OpenWebUI-User-Id" in (
        message
    )
    alone = {"Authorization": f"Bearer {KEY}", "X-Localserve-User": "DAVE"}
    assert chat(server, alone)[0] == 403


def test_daves_binding_survives_a_restart(tmp_path):
    server = fake_server(tmp_path)
    try:
        assert chat(server, owui("Dave", DAVE))[0] == 200
        assert kept(tmp_path) == [("openwebui", "dave", DAVE)]  # before the reply came
        wait_until(lambda: users_of_rows(tmp_path) == ["openwebui/dave"], 30, "dave's row")
    finally:
        server.close()
    restarted = fake_server(tmp_path)
    try:
        assert restarted.server.admission.people.num_people("openwebui") == 1
        refused_after_a_restart(restarted)  # first after the restart: still not dave
        assert chat(restarted, owui("David", DAVE))[0] == 200  # renamed: still dave
        wait_until(lambda: len(users_of_rows(tmp_path)) == 2, 30, "dave's second row")
        assert users_of_rows(tmp_path) == ["openwebui/dave", "openwebui/dave"]
        assert chat(restarted, owui("Mallory", MALLORY))[0] == 200  # a name of her own is fine
        assert kept(tmp_path) == [("openwebui", "dave", DAVE), ("openwebui", "mallory", MALLORY)]
    finally:
        restarted.close()


def test_the_bound_counts_the_people_kept(tmp_path):
    server = fake_server(tmp_path, max_people_per_frontend=2)
    try:
        for i in range(2):
            assert chat(server, owui(f"p{i}", f"id-{i}"))[0] == 200
    finally:
        server.close()
    restarted = fake_server(tmp_path, max_people_per_frontend=2)
    try:
        status, error = chat(restarted, owui("p2", "id-2"))
        assert status == 403 and "max_people_per_frontend" in error["error"]["message"]
        assert chat(restarted, owui("p1", "id-1"))[0] == 200  # the known ones go on
        assert len(kept(tmp_path)) == 2
    finally:
        restarted.close()


def test_a_store_that_cannot_be_written_refuses_new_people_and_known_ones_go_on(small_disk):
    server = fake_server(small_disk.path, usage=False)  # the usage record has its own test
    try:
        assert chat(server, owui("Dave", DAVE))[0] == 200
        small_disk.fill()
        status, headers, payload = http_request(
            server, "POST", "/api/chat", {"model": "fake", "messages": []}, owui("Erin", "id-e")
        )
        error = json.loads(payload)["error"]
        assert status == 503 and int(headers["Retry-After"]) > 0, payload
        assert "X-OpenWebUI-User-Name: new people cannot be recorded now" in error
        assert "full" in error and "known ones go on" in error
        status, error = chat(server, owui("Erin", "id-e"))
        assert status == 503 and error["error"]["type"] == "server_error"
        assert chat(server, owui("Dave", DAVE))[0] == 200
        assert server.server.admission.people.num_people("openwebui") == 1
        small_disk.free()
        assert chat(server, owui("Erin", "id-e"))[0] == 200
        assert len(kept(small_disk.path)) == 2
    finally:
        server.close()


def test_a_store_deleted_under_the_server_refuses_new_people_and_a_restart_on_none(tmp_path):
    """people.sqlite3 deleted while serving: a new person is a 503 with Retry-After (a binding
    committed into the unlinked file would be gone at the next start, the name free for
    anyone) and /healthz says why; dave goes on. A restart finds no store while the usage
    record has openwebui's people: it stops, in one line, rather than start with every name
    free for the taking."""
    server = fake_server(tmp_path)
    try:
        assert chat(server, owui("Dave", DAVE))[0] == 200
        wait_until(lambda: users_of_rows(tmp_path) == ["openwebui/dave"], 30, "dave's row")
        (tmp_path / DATABASE).unlink()
        status, headers, payload = http_request(
            server, "POST", "/v1/chat/completions", {"model": "fake", "messages": []},
            owui("Erin", "id-e"),
        )  # fmt: skip
        message = json.loads(payload)["error"]["message"]
        assert status == 503 and int(headers["Retry-After"]) > 0, payload
        assert f"{tmp_path / DATABASE} was deleted while serving; restart the server" in message
        assert chat(server, owui("Dave", DAVE))[0] == 200  # known: goes on
        status, _, health = http_request(server, "GET", "/healthz")
        assert status == 503 and "new people refused: " in json.loads(health)["problem"]
        assert not (tmp_path / DATABASE).exists()  # nothing written where it was
    finally:
        server.close()
    with pytest.raises(PeopleUnusable, match="names nobody, but .* of 1 person of openwebui"):
        fake_server(tmp_path)


def test_a_file_that_is_not_a_store_stops_the_server_at_start_naming_it(tmp_path):
    (tmp_path / DATABASE).write_bytes(b"\0garbage" * 512)
    with pytest.raises(PeopleUnusable, match=f"{tmp_path / DATABASE}: not a usable store"):
        fake_server(tmp_path)
    (tmp_path / DATABASE).unlink()
    plain = FakeServer(access=Access(USERS), state_dir=str(tmp_path))  # no trusted front-end
    plain.close()
    assert not (tmp_path / DATABASE).exists()  # nobody to keep: no file


# --- a real server process, killed ----------------------------------------------------------


def serve(state: Path) -> tuple:
    """`localserve serve` with Open WebUI trusted, on this state dir: the process, its server."""
    config = state / "models.toml"
    config.write_text(
        'default = "gemma-3-270m"\n[models.gemma-3-270m]\nembedded = true\n'
        'chat_format = "transcript"\nchat_template = "gemma"\nn_ctx = 2048\nn_threads = 2\n'
        '[server]\ntrusted_frontends = ["openwebui"]\n'
    )
    users = ",".join(f"{u}:{t}" for u, t in USERS.items())
    env = {"LOCALSERVE_USERS": users, "LOCALSERVE_MODELS": str(config)}
    proc, url = start_serve(state, env)
    return proc, SimpleNamespace(http=url.replace("ws://", "http://", 1), model_name=MODEL)


def first_token(server, headers: dict) -> bytes:
    """The first event with text of a long streamed reply (left open: the server dies)."""
    url = urllib.parse.urlsplit(server.http)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count from 1 to 300."}],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    response = conn.getresponse()
    assert response.status == 200
    while b'"content":"' not in (line := response.readline()):
        assert line, "the reply ended"
    return line


@pytest.mark.model
def test_daves_binding_survives_a_sigkill_mid_reply(tmp_path):
    proc, server = serve(tmp_path)
    try:
        assert first_token(server, owui("Dave", DAVE)).startswith(b"data: ")
    finally:
        kill_serve(proc)  # dave's first reply is under way: nothing shuts down cleanly
    assert kept(tmp_path) == [("openwebui", "dave", DAVE)]
    proc, server = serve(tmp_path)
    try:
        refused_after_a_restart(server)
        assert chat(server, owui("D.", DAVE))[0] == 200
        wait_until(lambda: "openwebui/dave" in users_of_rows(tmp_path), 30, "dave's row")
        assert set(users_of_rows(tmp_path)) == {"openwebui/dave"}
    finally:
        kill_serve(proc)
