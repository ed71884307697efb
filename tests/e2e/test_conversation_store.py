"""Conversations kept on the server (issue 27): the frames over a real websocket, the store's
bounds, a person seeing only their own, and a SIGKILLed server losing no saved conversation.
The page's side of it is in test_chat_page.py."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from localserve.bench.blocking_ws import WS
from localserve.bench.fake_server import FakeServer
from localserve.config import ServerConfig
from localserve.ops.auth import Access
from localserve.ops.conversations import DATABASE, ConversationStore, StoreUnusable
from tests.support.cli import kill_serve, start_serve

USERS = {"ann": "ann-secret-token", "ben": "ben-secret-token"}


def conversation(id: str, title: str = "A chat", *texts: str) -> dict:
    roles = ["user", "assistant"]
    messages = [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]
    return {"id": id, "title": title, "created": 1_700_000_000_000, "messages": messages}


def next_of(ws: WS, kind: str) -> dict:
    return ws.until(lambda f: f["type"] in (kind, "error"), 10)[-1]


def answer(ws: WS) -> dict:
    """The answer to this connection's save (not the news of another connection's)."""
    return ws.until(lambda f: f.get("here") is True or f["type"] == "error", 10)[-1]


@pytest.fixture
def server(tmp_path):
    made = FakeServer(
        access=Access(USERS),
        state_dir=str(tmp_path),
        max_conversations_per_user=3,
        max_conversation_bytes_per_user=64 << 10,
    )
    yield made
    made.close()


def signed_in(server, user: str) -> tuple[WS, dict]:
    ws = WS(server.url)
    welcome = ws.hello(user, USERS[user])
    return ws, welcome


def test_a_person_lists_saves_opens_renames_and_deletes_their_own(server):
    ann, welcome = signed_in(server, "ann")
    assert welcome["conversations"] is True
    ann.send({"type": "list_conversations"})
    empty = next_of(ann, "conversation_list")
    assert empty == {
        "type": "conversation_list",
        "conversations": [],
        "used_bytes": 0,
        "max_bytes": 64 << 10,
        "max_count": 3,
        "offset": 0,
        "total": 0,
    }
    ann.send(
        {
            "type": "save_conversation",
            "conversation": conversation("c1", "Soup", "How do I make soup?", "Boil water."),
        }
    )
    saved = next_of(ann, "conversation_saved")
    assert saved["here"] is True and saved["summary"]["revision"] == 1
    assert saved["summary"]["title"] == "Soup" and saved["summary"]["bytes"] > 0
    ann.send({"type": "get_conversation", "id": "c1"})
    found = next_of(ann, "conversation")
    messages = found["conversation"]["messages"]
    assert [m["content"] for m in messages] == ["How do I make soup?", "Boil water."]
    ann.send({"type": "rename_conversation", "id": "c1", "title": "Soup, simply"})
    renamed = next_of(ann, "conversation_saved")
    assert renamed["summary"]["title"] == "Soup, simply" and renamed["summary"]["revision"] == 2
    ann.send({"type": "delete_conversation", "id": "c1"})
    assert next_of(ann, "conversation_deleted") == {
        "type": "conversation_deleted",
        "id": "c1",
        "here": True,
    }
    ann.send({"type": "get_conversation", "id": "c1"})
    gone = next_of(ann, "conversation")
    assert gone["type"] == "error" and gone["code"] == "unknown_id" and gone["id"] == "c1"
    ann.close()


def test_another_person_sees_none_and_the_same_person_elsewhere_hears_of_changes(server):
    ann, _ = signed_in(server, "ann")
    phone, _ = signed_in(server, "ann")
    ben, _ = signed_in(server, "ben")
    ann.send(
        {
            "type": "save_conversation",
            "conversation": conversation("secret", "Ann's plans", "a surprise party for Ben"),
        }
    )
    assert next_of(ann, "conversation_saved")["here"] is True
    heard = next_of(phone, "conversation_saved")
    assert heard["here"] is False and heard["summary"]["id"] == "secret"
    ben.send({"type": "list_conversations"})
    assert next_of(ben, "conversation_list")["conversations"] == []
    ben.send({"type": "get_conversation", "id": "secret"})  # the id known: still not his
    assert next_of(ben, "conversation")["code"] == "unknown_id"
    ben.send({"type": "delete_conversation", "id": "secret"})
    assert next_of(ben, "conversation_deleted")["code"] == "unknown_id"
    ben.send({"type": "save_conversation", "conversation": conversation("secret", "Ben's")})
    assert next_of(ben, "conversation_saved")["here"] is True  # his own, of the same id
    phone.send({"type": "get_conversation", "id": "secret"})
    got = next_of(phone, "conversation")["conversation"]
    assert got["title"] == "Ann's plans" and "surprise" in got["messages"][0]["content"]
    for ws in (ann, phone, ben):
        ws.close()


def heard_before_a_list(ws: WS) -> list[dict]:
    """Every frame this connection was sent up to the answer to a list it asks for now."""
    ws.send({"type": "list_conversations"})
    return ws.until(lambda f: f["type"] in ("conversation_list", "error"), 10)[:-1]


def test_a_change_is_told_to_the_persons_own_connections_only(server):
    """Each save, rename and delete of ann's reaches her phone and nobody else: ben hears
    nothing of it, nor ann of his (every frame read, not only those of one type)."""
    ann, _ = signed_in(server, "ann")
    phone, _ = signed_in(server, "ann")
    ben, _ = signed_in(server, "ben")
    ann.send({"type": "save_conversation", "conversation": conversation("c1", "Ann's")})
    assert answer(ann)["here"] is True
    ann.send({"type": "rename_conversation", "id": "c1", "title": "Ann's, renamed"})
    assert answer(ann)["here"] is True
    ben.send({"type": "save_conversation", "conversation": conversation("c2", "Ben's")})
    assert answer(ben)["here"] is True
    ann.send({"type": "delete_conversation", "id": "c1"})
    assert answer(ann)["here"] is True
    assert heard_before_a_list(ben) == []
    assert heard_before_a_list(ann) == []
    heard = heard_before_a_list(phone)
    assert [(f["type"], f["here"]) for f in heard] == [
        ("conversation_saved", False),
        ("conversation_saved", False),
        ("conversation_deleted", False),
    ]
    assert [heard[0]["summary"]["title"], heard[1]["summary"]["title"], heard[2]["id"]] == [
        "Ann's",
        "Ann's, renamed",
        "c1",
    ]
    for ws in (ann, phone, ben):
        ws.close()


def test_a_rename_changes_the_renamers_own_conversation_only(server):
    """ann and ben each have a conversation "c1": ben's rename leaves ann's as it was."""
    ann, _ = signed_in(server, "ann")
    ben, _ = signed_in(server, "ben")
    ann.send({"type": "save_conversation", "conversation": conversation("c1", "Ann's", "q")})
    assert answer(ann)["summary"]["revision"] == 1
    ben.send({"type": "save_conversation", "conversation": conversation("c1", "Ben's", "q")})
    assert answer(ben)["summary"]["revision"] == 1
    ben.send({"type": "rename_conversation", "id": "c1", "title": "Ben's, renamed"})
    renamed = answer(ben)["summary"]
    assert renamed["title"] == "Ben's, renamed" and renamed["revision"] == 2
    ann.send({"type": "get_conversation", "id": "c1"})
    found = next_of(ann, "conversation")
    assert found["conversation"]["title"] == "Ann's" and found["summary"]["revision"] == 1
    ann.send({"type": "list_conversations"})
    listed = next_of(ann, "conversation_list")["conversations"]
    assert [(c["title"], c["revision"]) for c in listed] == [("Ann's", 1)]
    for ws in (ann, ben):
        ws.close()


def test_the_bounds_are_said_and_nothing_is_deleted_to_make_room(server):
    ann, _ = signed_in(server, "ann")
    for i in range(3):
        ann.send({"type": "save_conversation", "conversation": conversation(f"c{i}", f"n{i}")})
        assert next_of(ann, "conversation_saved")["here"]
    ann.send({"type": "save_conversation", "conversation": conversation("c3", "one too many")})
    refused = next_of(ann, "conversation_saved")
    assert refused["code"] == "not_saved" and refused["id"] == "c3"
    assert "you keep 3 conversations" in refused["message"] and "delete old" in refused["message"]
    ann.send({"type": "save_conversation", "conversation": conversation("c0", "n0", "again")})
    assert next_of(ann, "conversation_saved")["summary"]["revision"] == 2  # an old one: saved
    big = "x" * 30_000
    ann.send({"type": "save_conversation", "conversation": conversation("c1", "big", big)})
    assert next_of(ann, "conversation_saved")["here"]
    ann.send({"type": "save_conversation", "conversation": conversation("c2", "big", big, big)})
    refused = next_of(ann, "conversation_saved")
    assert refused["code"] == "not_saved" and "of the 0.1 MiB it keeps" in refused["message"]
    ann.send({"type": "list_conversations"})
    listed = next_of(ann, "conversation_list")
    assert sorted(c["id"] for c in listed["conversations"]) == ["c0", "c1", "c2"]
    ann.send({"type": "delete_conversation", "id": "c1"})  # room again
    next_of(ann, "conversation_deleted")
    ann.send({"type": "save_conversation", "conversation": conversation("c2", "big", big, big)})
    assert next_of(ann, "conversation_saved")["here"]
    ann.close()


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"id": "../../etc", "messages": []}, "conversation.id"),
        ({"id": "c", "title": "t" * 201}, "conversation.title"),
        ({"id": "c", "messages": [{"role": "system", "content": "x"}]}, "role"),
        ({"id": "c", "messages": [{"role": "user"}]}, "content"),
        ({"id": "c", "created": -1}, "created"),
    ],
)
def test_a_bad_conversation_is_refused_with_the_field_named(server, bad, words):
    ann, _ = signed_in(server, "ann")
    ann.send({"type": "save_conversation", "conversation": bad})
    refused = next_of(ann, "conversation_saved")
    assert refused["code"] == "bad_request" and words in refused["message"]
    ann.send({"type": "list_conversations"})  # the connection goes on
    assert next_of(ann, "conversation_list")["conversations"] == []
    ann.close()


def test_a_server_without_users_keeps_none(tmp_path):
    server = FakeServer(state_dir=str(tmp_path))
    try:
        ws = WS(server.url)
        assert ws.hello("anyone")["conversations"] is False
        ws.send({"type": "list_conversations"})
        refused = next_of(ws, "conversation_list")
        assert refused["code"] == "bad_request" and "stay in the browser" in refused["message"]
        ws.close()
        assert not (tmp_path / DATABASE).exists()
    finally:
        server.close()


def test_a_store_that_is_not_one_is_said_at_start_up(tmp_path):
    (tmp_path / DATABASE).write_bytes(b"\0garbage" * 512)
    with pytest.raises(StoreUnusable, match="not a usable conversation store.*move it aside"):
        ConversationStore.open(ServerConfig(state_dir=str(tmp_path)))


# --- a real server process, killed --------------------------------------------------------------


def serve_with_users(state: Path):
    return start_serve(state, {"LOCALSERVE_USERS": ",".join(f"{u}:{t}" for u, t in USERS.items())})


@pytest.mark.model
def test_a_killed_server_loses_no_saved_conversation(tmp_path):
    proc, url = serve_with_users(tmp_path)
    saved: list[int] = []
    try:
        ws = WS(url)
        ws.hello("ann", USERS["ann"])
        for i in range(20):
            ws.send(
                {
                    "type": "save_conversation",
                    "conversation": conversation(
                        f"c{i}", f"chat {i}", f"question {i}", f"answer {i}"
                    ),
                }
            )
            if next_of(ws, "conversation_saved").get("here"):
                saved.append(i)
        ws.chat("r1", "Count from 1 to 300.", max_tokens=400, ignore_eos=True)
        ws.until(lambda f: f["type"] == "token", 60)  # mid-reply
    finally:
        kill_serve(proc)
    assert saved == list(range(20))
    db = sqlite3.connect(tmp_path / DATABASE)
    kept = dict(db.execute("SELECT id, title FROM conversations WHERE user = 'ann'"))
    db.close()
    assert kept == {f"c{i}": f"chat {i}" for i in range(20)}
    restarted, url = serve_with_users(tmp_path)  # and the server starts on it again
    try:
        ws = WS(url)
        ws.hello("ann", USERS["ann"])
        ws.send({"type": "list_conversations"})
        assert len(next_of(ws, "conversation_list")["conversations"]) == 20
        ws.close()
    finally:
        kill_serve(restarted)


def test_a_long_list_comes_in_pages_and_a_big_conversation_comes_back(tmp_path):
    server = FakeServer(
        access=Access(USERS), state_dir=str(tmp_path), max_frame_bytes=512 << 10
    )  # frames bigger than the outbox's 256 KiB: still sent back whole
    try:
        ann, _ = signed_in(server, "ann")
        for i in range(250):
            ann.send(
                {"type": "save_conversation", "conversation": conversation(f"c{i:03}", "é" * 200)}
            )
        ann.until(lambda f: f.get("summary", {}).get("id") == "c249", 30)
        pages, offset = [], 0
        while True:
            ann.send({"type": "list_conversations", "offset": offset})
            page = next_of(ann, "conversation_list")
            pages.append(len(page["conversations"]))
            offset += len(page["conversations"])
            if offset >= page["total"]:
                break
        assert pages == [100, 100, 50] and page["total"] == 250
        big = "x" * (500 << 10)
        ann.send({"type": "save_conversation", "conversation": conversation("big", "big", big)})
        assert next_of(ann, "conversation_saved")["here"]
        ann.send({"type": "get_conversation", "id": "big"})
        assert next_of(ann, "conversation")["conversation"]["messages"][0]["content"] == big
        ann.close()
    finally:
        server.close()


def test_a_copy_older_than_the_stored_one_is_refused_as_a_conflict(server):
    laptop, _ = signed_in(server, "ann")
    phone, _ = signed_in(server, "ann")
    laptop.send({"type": "save_conversation", "conversation": conversation("c1", "t", "q")})
    assert answer(laptop)["summary"]["revision"] == 1
    phone.send(
        {
            "type": "save_conversation",
            "base_revision": 1,
            "conversation": conversation("c1", "t", "q", "a", "phone's turn"),
        }
    )
    assert answer(phone)["summary"]["revision"] == 2
    laptop.send(
        {
            "type": "save_conversation",
            "base_revision": 1,
            "conversation": conversation("c1", "t", "q", "laptop's reply"),
        }
    )
    refused = answer(laptop)
    assert refused["code"] == "conflict" and refused["id"] == "c1"
    assert "changed elsewhere meanwhile (revision 2" in refused["message"]
    laptop.send({"type": "save_conversation", "conversation": {"id": "c9", "title": "t" * 201}})
    broken = answer(laptop)  # the id found inside the bad frame
    assert broken["code"] == "bad_request" and broken["id"] == "c9"
    for ws in (laptop, phone):
        ws.close()


# --- each conversation remembers its model ------------------------------------------------------


def test_a_conversation_keeps_its_model_and_one_without_has_none(server):
    ann, _ = signed_in(server, "ann")
    with_model = conversation("m1", "Picked", "hi") | {"model": "other"}
    for saved in (with_model, conversation("m2", "Default", "hi")):
        ann.send({"type": "save_conversation", "conversation": saved})
        assert answer(ann)["type"] == "conversation_saved"
    for id, model in (("m1", "other"), ("m2", None)):
        ann.send({"type": "get_conversation", "id": id})
        assert next_of(ann, "conversation")["conversation"]["model"] == model
    ann.close()


SCHEMA_1 = """CREATE TABLE conversations (
    user TEXT NOT NULL, id TEXT NOT NULL, title TEXT NOT NULL, created INTEGER NOT NULL,
    updated INTEGER NOT NULL, revision INTEGER NOT NULL, bytes INTEGER NOT NULL,
    messages BLOB NOT NULL, PRIMARY KEY (user, id)
) WITHOUT ROWID"""


def test_a_store_written_before_models_were_kept_still_loads_and_saves_models(tmp_path):
    import asyncio

    from localserve.protocol.frames import SavedConversation

    db = sqlite3.connect(tmp_path / DATABASE)
    db.execute(SCHEMA_1)
    messages = b'[{"role":"user","content":"old question"}]'
    db.execute("INSERT INTO conversations VALUES ('ann','old','Old',1,2,1,10,?)", (messages,))
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()

    async def use() -> tuple:
        store = ConversationStore.open(ServerConfig(state_dir=str(tmp_path)))
        try:
            old, _ = await store.get("ann", "old")
            await store.save("ann", SavedConversation("new", "New", 3, [], model="other"))
            new, _ = await store.get("ann", "new")
            return old, new
        finally:
            store.close()

    old, new = asyncio.run(use())
    assert (old.title, old.messages[0].content, old.model) == ("Old", "old question", None)
    assert new.model == "other"
