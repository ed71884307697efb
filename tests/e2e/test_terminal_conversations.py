"""The terminal chat and the conversations a server with users keeps (tui/server_chats.py): a
conversation saved as the page saves it is listed and resumed by `localserve chat`, its turns
there are saved back in the same form and seen by a fresh list and get, a conflict keeps both
copies, and every slip is one line. The server is the real one on loopback over the paced fake
runner: what is tested is what is kept, not what a model says."""

from __future__ import annotations

import asyncio
import io
import re

import pytest

from localserve.bench.blocking_ws import WS
from localserve.bench.fake_server import FakeServer
from localserve.ops.auth import Access
from tui.chat import ChatClient

USERS = {"ann": "ann-secret-token", "ben": "ben-secret-token"}
STOPPED = {"prompt_tokens": 9, "completion_tokens": 3, "cached_tokens": 0}
TIMINGS = {"queue_ms": 1.0, "ttft_ms": 20.0, "itl_ms": 5.0, "e2e_ms": 40.0}


@pytest.fixture
def server(tmp_path):
    made = FakeServer(access=Access(USERS), state_dir=str(tmp_path))
    yield made
    made.close()


def page_conversation(id: str, title: str, created: int, *turns: tuple[str, str]) -> dict:
    """A conversation as the chat page saves it (app.js's stored()): replies with their status,
    finish, usage and timings."""
    messages = []
    for question, answer in turns:
        messages.append({"role": "user", "content": question})
        messages.append(
            {
                "role": "assistant",
                "content": answer,
                "status": "done",
                "finish": "stop",
                "usage": STOPPED,
                "timings": TIMINGS,
            }
        )
    return {"id": id, "title": title, "created": created, "messages": messages}


def page_save(server, conversation: dict, base_revision: int | None = None) -> dict:
    ws = WS(server.url)
    ws.hello("ann", USERS["ann"])
    ws.send(
        {"type": "save_conversation", "conversation": conversation, "base_revision": base_revision}
    )
    saved = ws.until(lambda f: f.get("here") is True or f["type"] == "error", 10)[-1]
    ws.close()
    assert saved["type"] == "conversation_saved", saved
    return saved["summary"]


def page_ask(server, frame: dict) -> dict:
    """One conversation frame from a fresh connection of ann's (a page opened anew)."""
    ws = WS(server.url)
    ws.hello("ann", USERS["ann"])
    ws.send(frame)
    answer = ws.until(lambda f: f["type"] in ("conversation_list", "conversation", "error"), 10)
    ws.close()
    return answer[-1]


def terminal(server, *lines, user: str = "ann", **kw) -> tuple[ChatClient, io.StringIO]:
    async def typed():
        for line in lines:
            yield line() if callable(line) else line  # a callable: what happens meanwhile

    out = io.StringIO()
    token = USERS.get(user)
    client = ChatClient(
        server.url, user, token, max_tokens=12, temperature=0, lines=typed(), out=out, **kw
    )
    return client, out


def run(client: ChatClient) -> int:
    return asyncio.run(asyncio.wait_for(client.run(), 60))


def test_a_page_conversation_is_listed_resumed_and_its_new_turn_saved_back(server):
    soup = page_conversation(
        "c1", "Soup", 1_700_000_000_000, ("How do I make soup?", "Boil water."), ("Then?", "Salt.")
    )
    page_save(server, soup)
    page_save(server, page_conversation("c2", "Tea", 1_700_000_100_000, ("Tea?", "Yes.")))
    client, out = terminal(server, "/chats", "/resume 2", "And after the salt?", "/quit")
    assert run(client) == 0
    text = out.getvalue()
    listed = re.findall(r"^(?:you> )?[ *]\s+\d\. (\w+)", text, re.M)
    assert listed == ["Tea", "Soup"], text  # newest first
    assert "(1–2 of 2; /resume N goes on with N)" in text
    assert "(resumed “Soup”: 4 messages, last saved today" in text
    assert "you> Then?\nmodel> Salt.\n" in text  # where it stands: its last turns
    assert [m.content for m in client.history] == [
        "How do I make soup?",
        "Boil water.",
        "Then?",
        "Salt.",
        "And after the salt?",
        client.history[-1].content,
    ]
    got = page_ask(server, {"type": "get_conversation", "id": "c1"})
    assert got["summary"]["revision"] == 2 and got["conversation"]["title"] == "Soup"
    messages = got["conversation"]["messages"]
    assert messages[:4] == soup["messages"]  # the page's turns, as they were
    assert messages[4] == {"role": "user", "content": "And after the salt?"}
    reply = messages[5]
    assert reply["status"] == "done" and reply["finish"] in ("stop", "length")
    assert reply["content"] == client.history[-1].content
    assert reply["usage"]["completion_tokens"] > 0 and reply["timings"]["ttft_ms"] is not None
    # the model was sent the whole history: the same question alone is a shorter prompt
    alone, _ = terminal(server, "And after the salt?")
    assert run(alone) == 0
    listed = page_ask(server, {"type": "list_conversations"})["conversations"]
    new = next(s for s in listed if s["id"] not in ("c1", "c2"))
    fresh = page_ask(server, {"type": "get_conversation", "id": new["id"]})["conversation"]
    fresh_prompt = fresh["messages"][1]["usage"]["prompt_tokens"]
    assert reply["usage"]["prompt_tokens"] > fresh_prompt + 10


def test_a_conversation_started_in_the_terminal_is_saved_as_the_page_would(server):
    client, out = terminal(server, "A soup recipe, please\nwith leeks", "Thanks!")
    assert run(client) == 0
    listed = page_ask(server, {"type": "list_conversations"})
    assert listed["total"] == 1
    summary = listed["conversations"][0]
    assert re.fullmatch(r"c[0-9a-z]+[0-9a-f]{8}", summary["id"])
    assert summary["title"] == "A soup recipe, please"  # the first line, as the page titles
    assert summary["revision"] == 2  # one save a turn, of the same conversation
    got = page_ask(server, {"type": "get_conversation", "id": summary["id"]})["conversation"]
    assert [m["role"] for m in got["messages"]] == ["user", "assistant"] * 2
    assert all(m["status"] == "done" for m in got["messages"][1::2])
    client, out = terminal(server, "/new", "Another", resume="")  # --resume: the newest
    assert run(client) == 0
    assert "(resumed “A soup recipe, please”: 4 messages" in out.getvalue()
    assert page_ask(server, {"type": "list_conversations"})["total"] == 2  # /new: its own


def test_a_conflict_keeps_the_other_devices_turns_and_this_terminals(server):
    page_save(server, page_conversation("c1", "Soup", 1_700_000_000_000, ("Soup?", "Boil.")))

    def the_phone_saves_meanwhile():
        phone = page_conversation("c1", "Soup", 1_700_000_000_000, ("Soup?", "Boil."))
        phone["messages"] += page_conversation("x", "", 0, ("From the phone", "Ok."))["messages"]
        page_save(server, phone, base_revision=1)
        return "And from the terminal?"

    client, out = terminal(server, "/resume c1", the_phone_saves_meanwhile, "One more")
    assert run(client) == 0
    text = out.getvalue()
    conflict = [line for line in text.splitlines() if "another device" in line]
    assert conflict == [
        "[“Soup” was changed on another device meanwhile: this terminal's copy is kept as "
        "“Soup (this device)”, and goes on there (/chats lists both)]"
    ]
    listed = page_ask(server, {"type": "list_conversations"})["conversations"]
    assert sorted(s["title"] for s in listed) == ["Soup", "Soup (this device)"]
    phone = page_ask(server, {"type": "get_conversation", "id": "c1"})["conversation"]
    assert [m["content"] for m in phone["messages"]][2:] == ["From the phone", "Ok."]
    copy_id = next(s["id"] for s in listed if s["id"] != "c1")
    copy = page_ask(server, {"type": "get_conversation", "id": copy_id})["conversation"]
    questions = [m["content"] for m in copy["messages"] if m["role"] == "user"]
    assert questions == ["Soup?", "And from the terminal?", "One more"]  # no turn lost
    assert copy["created"] == 1_700_000_000_000


def test_a_long_list_is_paged_and_numbers_resume_what_was_shown(server):
    ws = WS(server.url)
    ws.hello("ann", USERS["ann"])
    for i in range(45):
        chat = page_conversation(f"c{i:02}", f"chat {i}", 1_700_000_000_000 + i, ("q", "a"))
        ws.send({"type": "save_conversation", "conversation": chat})
    ws.until(lambda f: f.get("summary", {}).get("id") == "c44", 30)
    ws.close()

    def a_newer_one_meanwhile():
        page_save(server, page_conversation("new", "newer", 1_800_000_000_000, ("q", "a")))
        return "/resume 1"  # the 1 shown, not the newest now

    lines = ("/chats", "/chats 3", "/chats 4", "/resume 42", a_newer_one_meanwhile)
    client, out = terminal(server, *lines)
    assert run(client) == 0
    text = out.getvalue()
    assert "(1–20 of 45; /chats 2 for more; /resume N goes on with N)" in text
    assert "(41–45 of 45; /resume N goes on with N)" in text
    assert " 41. chat 4 " in text and " 45. chat 0 " in text
    assert "(no page 4: your 45 conversations fill 3 of 20 each)" in text
    assert "(resumed “chat 3”" in text  # number 42 of the list: the 42nd newest
    assert "(resumed “chat 44”" in text


def test_every_slip_is_one_line_and_the_chat_goes_on(server):
    page_save(server, page_conversation("c1", "Soup", 1_700_000_000_000, ("Soup?", "Boil.")))
    slips = ["/resume 7", "/resume 0", "/resume nope", "/resume " + "x" * 300_000]
    slips += ["/resume ../etc", "/chats zero", "/chats 99999999999", "/resume 1 2"]
    client, out = terminal(server, *slips, "Still there?")
    assert run(client) == 0
    text = out.getvalue()
    assert "Traceback" not in text
    answers = text.split("you> ")[1 : len(slips) + 1]
    assert all(len(a.strip().splitlines()) == 1 for a in answers), answers
    assert "no conversation 7 on the server (you have 1)" in answers[0]
    assert "no conversation 0 on the server" in answers[1]
    assert "you have no conversation 'nope' on this server" in answers[2]
    assert "/resume takes a number from /chats or a conversation id" in answers[3]
    assert len(answers[3]) < 200  # the paste is not said back whole
    assert "/chats takes a page number" in answers[5] and "/chats takes" in answers[6]
    assert "/resume takes" in answers[7]
    assert text.split("you> ")[len(slips) + 1].startswith("model> ")  # and the chat went on


def test_a_server_that_keeps_none_says_so_in_one_line():
    server = FakeServer()  # no users: the page keeps its conversations in the browser
    try:
        client, out = terminal(server, "/chats", "/resume 1", "Hello", user="zed")
        assert run(client) == 0
        lines = out.getvalue().splitlines()
        said = [line for line in lines if "keeps no conversations" in line]
        assert len(said) == 2, lines
        assert "model> " in out.getvalue()  # a turn, nothing saved, nothing said of it
        err = io.StringIO()
        client, out = terminal(server, "Hello", user="zed", resume="", err=err)
        assert run(client) == 2
        assert err.getvalue().strip().splitlines() == [
            "localserve chat: --resume: this server keeps no conversations (it has no users): "
            "/chats and /resume need one"
        ]
    finally:
        server.close()


def test_the_answer_taken_is_this_connections_not_the_news_of_anothers(server):
    """`stored` skips what the person's other connections did meanwhile
    (localserve/websocket_client.py)."""
    from localserve.protocol.frames import GetConversation, ListConversations, SaveConversation
    from localserve.protocol.frames import SavedConversation as Saved
    from localserve.websocket_client import Client, ClientError, stored

    async def both():
        here = await Client.connect(server.url, "ann", USERS["ann"])
        phone = await Client.connect(server.url, "ann", USERS["ann"])
        first = await stored(phone, SaveConversation(Saved("c1", "From the phone")))
        # `here` has the news of it (here: false) waiting: not the answer to its own save
        mine = await stored(here, SaveConversation(Saved("c1", "Mine"), first.summary.revision))
        listed = await stored(here, ListConversations())
        try:
            await stored(here, GetConversation("nope"))
        except ClientError as e:
            refused = e.code
        await here.close()
        await phone.close()
        return first, mine, listed, refused

    first, mine, listed, refused = asyncio.run(both())
    assert (first.summary.revision, mine.summary.revision) == (1, 2) and mine.here
    assert [s.title for s in listed.conversations] == ["Mine"] and refused == "unknown_id"
