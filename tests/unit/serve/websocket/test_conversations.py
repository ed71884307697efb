"""A person's conversation frames (localserve/serve/websocket/conversations.py) through real
connections on a fake Frontdoor (tests/support/fake_frontdoor.py), over in-memory sockets, with
the store in a temporary SQLite file: a save or rename is answered `here` and told to the same
person's other connections, never to anyone else's; another person's conversation cannot be
renamed, deleted or read (unknown_id); a server without users keeps none."""

from __future__ import annotations

import asyncio

from localserve.ops.auth import Access
from localserve.ops.conversations import ConversationStore
from tests.support.door_connection import connected, connections_of
from tests.support.fake_frontdoor import FakeFrontdoor

SAVE = {"type": "save_conversation",
        "conversation": {"id": "c1", "title": "Paris", "messages": [
            {"role": "user", "content": "What is the capital of France?"}]}}  # fmt: skip
TOKENS = {"ann": "ann-token", "bob": "bob-token"}


def test_a_save_and_a_rename_are_told_to_the_persons_other_connections_only(tmp_path):
    async def scenario():
        door = FakeFrontdoor(access=Access(TOKENS))
        store = ConversationStore(tmp_path / "conversations.sqlite3", 100, 1 << 20)
        shared = connections_of(door, store)
        async with (
            connected(door, "ann", "ann-token", shared) as here,
            connected(door, "ann", "ann-token", shared) as phone,
            connected(door, "bob", "bob-token", shared) as bob,
        ):
            here.say(SAVE)
            saved = await here.next_of("conversation_saved")
            assert saved["here"] is True and saved["summary"]["title"] == "Paris"
            assert (await phone.next_of("conversation_saved"))["here"] is False
            here.say({"type": "rename_conversation", "id": "c1", "title": "France"})
            renamed = await phone.next_of("conversation_saved", n=2)
            assert renamed["summary"]["title"] == "France" and renamed["here"] is False
            await here.next_of("conversation_saved", n=2)
            bob.say({"type": "list_conversations"})
            listed = await bob.next_of("conversation_list")
            assert listed["conversations"] == []
            assert bob.of("conversation_saved") == [] and bob.of("conversation_deleted") == []
        store.close()

    asyncio.run(scenario())


def test_another_persons_conversation_cannot_be_renamed_deleted_or_read(tmp_path):
    async def scenario():
        door = FakeFrontdoor(access=Access(TOKENS))
        store = ConversationStore(tmp_path / "conversations.sqlite3", 100, 1 << 20)
        shared = connections_of(door, store)
        async with (
            connected(door, "ann", "ann-token", shared) as ann,
            connected(door, "bob", "bob-token", shared) as bob,
        ):
            ann.say(SAVE)
            await ann.next_of("conversation_saved")
            for n, frame in enumerate([
                {"type": "rename_conversation", "id": "c1", "title": "mine now"},
                {"type": "delete_conversation", "id": "c1"},
                {"type": "get_conversation", "id": "c1"},
            ], start=1):  # fmt: skip
                bob.say(frame)
                assert (await bob.next_of("error", "c1", n))["code"] == "unknown_id"
            ann.say({"type": "get_conversation", "id": "c1"})
            found = await ann.next_of("conversation")
            assert found["summary"]["title"] == "Paris" and found["summary"]["revision"] == 1
            assert len(ann.of("conversation_saved")) == 1  # bob's tries told ann nothing
        store.close()

    asyncio.run(scenario())


def test_a_server_without_users_keeps_no_conversations(tmp_path):
    async def scenario():
        door = FakeFrontdoor()  # no tokens: the page keeps them in the browser
        store = ConversationStore(tmp_path / "conversations.sqlite3", 100, 1 << 20)
        async with connected(door, "ann", None, connections_of(door, store)) as socket:
            assert socket.of("welcome")[0]["conversations"] is False
            socket.say(SAVE)
            error = await socket.next_of("error")
            assert error["code"] == "bad_request" and "keeps no conversations" in error["message"]
        store.close()

    asyncio.run(scenario())
