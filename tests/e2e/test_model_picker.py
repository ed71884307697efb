"""Picking a model (issue 38), on the real server over loopback with fake engines: a models.toml
that names models lists only those (no embedded toy model) in /v1/models, /api/tags and the
welcome; `list_models` says each model's state, what choosing it would unload and about how long
its load takes; a chat for a second model loads it (a swap: max_loaded_models = 1) and its `done`
names the model that answered. The real model and the page: tests/e2e/test_chat_page.py."""

from __future__ import annotations

import contextlib
import json
import urllib.request

import pytest

from localserve.bench.blocking_ws import WS
from localserve.config import DEFAULT_MODEL
from localserve.ops.usage_database import DATABASE as USAGE_DB
from tests.support.fakes import FAKE_LOAD_S as LOAD_S
from tests.support.fakes import two_fake_models
from tests.support.waiting import wait_until


@pytest.fixture
def served(tmp_path, monkeypatch):
    with two_fake_models(tmp_path, monkeypatch) as made:
        yield made


def get(served, path: str) -> dict:
    with urllib.request.urlopen(served.thread.http + path, timeout=30) as response:
        return json.loads(response.read())


def models_of(ws: WS) -> dict:
    ws.send({"type": "list_models"})
    return ws.until(lambda f: f["type"] in ("models", "error"), 30)[-1]


def by_name(frame: dict) -> dict:
    return {m["name"]: m for m in frame["models"]}


def test_only_the_configured_models_are_listed_the_first_the_default(served):
    assert served.name == "first"
    assert [m["id"] for m in get(served, "/v1/models")["data"]] == ["first", "second"]
    assert [m["name"] for m in get(served, "/api/tags")["models"]] == [
        "first:latest",
        "second:latest",
    ]
    ws = WS(served.thread.url)
    welcome = ws.hello("ann")
    assert (welcome["model"], welcome["models"]) == ("first", ["first", "second"])
    assert DEFAULT_MODEL not in json.dumps(get(served, "/v1/models"))
    ws.close()


def test_list_models_says_what_choosing_costs_and_done_names_the_model(served):
    ws = WS(served.thread.url)
    ws.send({"type": "list_models"})  # before hello: refused, as every frame but hello
    assert ws.recv(30)["code"] == "unauthorized"
    ws.hello("ann")
    before = models_of(ws)
    assert before["default"] == "first" and [m["name"] for m in before["models"]] == [
        "first",
        "second",
    ]
    first, second = before["models"]
    assert (first["state"], first["swap"], first["load_s"]) == ("loaded", [], None)
    assert (second["state"], second["swap"], second["swap_waits"]) == ("unloaded", ["first"], False)
    assert (second["load_s"], second["load_s_from"]) == (None, "")  # nothing to go by yet

    ws.chat("r1", "hello", max_tokens=4, model="second")
    frames = ws.until_done("r1", 30)
    assert any("loading model second" in f.get("loading", "") for f in frames)
    done = frames[-1]
    assert (done["finish_reason"], done["model"]) == ("length", "second")
    assert done["timings"]["load_ms"] >= LOAD_S * 1e3

    after = by_name(models_of(ws))
    assert after["second"]["state"] == "loaded" and after["first"]["state"] == "unloaded"
    assert after["first"]["swap"] == ["second"]
    assert after["second"]["load_s"] is None  # loaded: nothing to wait for
    ws.chat("r2", "hello", max_tokens=4)  # the default again: a swap back
    assert ws.until_done("r2", 30)[-1]["model"] == "first"
    measured = by_name(models_of(ws))["second"]
    assert measured["load_s_from"] == "last_load" and measured["load_s"] >= LOAD_S
    ws.close()


def test_a_bad_list_models_frame_gets_one_error_and_the_connection_goes_on(served):
    ws = WS(served.thread.url)
    ws.hello("ann")
    ws.send({"type": "list_models", "model": "x"})
    error = ws.recv(30)
    assert (
        error["type"] == "error" and error["code"] == "bad_request" and "model" in error["message"]
    )
    assert models_of(ws)["type"] == "models"
    ws.close()


# --- the terminal chat: --model and /model ------------------------------------------------------


def answered_by(state, user: str) -> list[tuple[str, str]]:
    """(client id, model) of the user's requests in the usage record, in order."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(state / USAGE_DB)) as db:
        rows = db.execute(
            "SELECT client_id, model FROM requests WHERE user = ? ORDER BY id", (user,)
        )
        return list(rows)


def terminal(served, *lines: str, **kw) -> tuple[int, str]:
    import asyncio
    import io

    from tui.chat import ChatClient

    async def script():
        for line in lines:
            yield line

    out = io.StringIO()
    client = ChatClient(
        served.thread.url, "tess", max_tokens=4, temperature=0, lines=script(), out=out, **kw
    )
    return asyncio.run(client.run()), out.getvalue()


def test_the_terminal_chat_starts_on_model_and_switches_with_slash_model(served, tmp_path):
    status, out = terminal(
        served, "hello", "/model", "/model nope", "/model first", "again", "/quit", model="second"
    )
    assert status == 0
    assert "Connected to second at" in out
    assert "    first   unloaded: would unload second (default)\n" in out
    assert "  * second  loaded\n" in out
    assert "no model 'nope' on this server; it has first, second (/model lists them)" in out
    assert "(the next turns go to first)" in out
    wait_until(lambda: answered_by(tmp_path, "tess")[1:], 30, "both rows in the usage record")
    assert [model for _, model in answered_by(tmp_path, "tess")] == ["second", "first"]


def test_an_unknown_model_on_the_command_line_is_one_line(served):
    import io

    err = io.StringIO()
    status, out = terminal(served, "hello", model="third", err=err)
    assert status == 2 and "model>" not in out
    assert err.getvalue() == (
        "localserve chat: --model: no model 'third' on this server; it has first, second "
        "(/model lists them)\n"
    )


def stored_conversation(served, user: str, token: str, id: str) -> dict:
    """The conversation as a page opened anew gets it."""
    ws = WS(served.thread.url)
    ws.hello(user, token)
    ws.send({"type": "get_conversation", "id": id})
    found = ws.until(lambda f: f["type"] in ("conversation", "error"), 30)[-1]
    ws.close()
    return found["conversation"]


def test_a_resumed_conversation_goes_on_with_its_model_and_keeps_it(tmp_path, monkeypatch):
    from localserve.ops.auth import Access

    token = "tess-secret-token"
    with two_fake_models(tmp_path, monkeypatch, access=Access({"tess": token})) as made:
        ws = WS(made.thread.url)
        ws.hello("tess", token)
        page = {"id": "c1", "title": "On second", "model": "second", "messages": []}
        ws.send({"type": "save_conversation", "conversation": page})  # as the page saves it
        saved = ws.until(lambda f: f.get("here") is True or f["type"] == "error", 30)[-1]
        ws.close()
        assert saved["type"] == "conversation_saved"
        status, out = terminal(made, "/resume c1", "more", "/quit", token=token)
        assert status == 0 and "(resumed “On second”: 0 messages" in out and ", on second)" in out
        wait_until(lambda: answered_by(tmp_path, "tess"), 30, "its row in the usage record")
        assert [model for _, model in answered_by(tmp_path, "tess")] == ["second"]
        kept = stored_conversation(made, "tess", token, "c1")
        assert kept["model"] == "second"  # the page reopens it on second
        assert kept["messages"][-1]["model"] == "second"  # and says who answered
        terminal(made, "/resume c1", "/model first", "again", "/quit", token=token)
        assert stored_conversation(made, "tess", token, "c1")["model"] == "first"  # switched
