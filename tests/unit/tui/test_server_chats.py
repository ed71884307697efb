"""The terminal chat's side of the conversations a server keeps (tui/server_chats.py): what is
sent again of a stored conversation, a reply stored as the page stores it, a new one's title and
id, the lines /chats and /resume print, and the commands on a server that keeps none. Against a
real server: e2e/test_terminal_conversations.py."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime

from localserve.protocol.frames import (
    ConversationSummary,
    Finished,
    Message,
    ReplyUsage,
    StoredMessage,
    Timings,
)
from tui import server_chats
from tui.model_picker import ModelPicker
from tui.server_chats import ServerChats


def done(finish: str) -> Finished:
    return Finished("r1", finish, ReplyUsage(10, 4, 2), Timings(1.0, 30.0, 5.0, 50.0))


def test_what_is_sent_again_is_what_the_page_sends_again():
    stored = [
        StoredMessage("user", "Soup?"),
        StoredMessage("assistant", "Boil.", status="done", reasoning="hm"),
        StoredMessage("user", "Then?"),
        StoredMessage("assistant", "", status="error", error="busy"),  # failed: left out
        StoredMessage("user", "Then?"),
        StoredMessage("assistant", "Salt", status="stopped"),
        StoredMessage("user", "And?"),
        StoredMessage("assistant", "half", status="interrupted"),  # cut short by the server
        StoredMessage("assistant", "no status"),  # never finished, as the page sees it
    ]
    assert server_chats.history_of(stored) == [
        Message("user", "Soup?"),
        Message("assistant", "Boil."),
        Message("user", "Then?"),
        Message("user", "Then?"),
        Message("assistant", "Salt"),
        Message("user", "And?"),
    ]


def test_a_reply_is_stored_with_its_status_as_the_page_stores_it():
    reply = server_chats.reply_message("Boil.", "first water", done("stop"), stopped=False)
    assert reply == StoredMessage(
        "assistant",
        "Boil.",
        status="done",
        finish="stop",
        usage=ReplyUsage(10, 4, 2),
        timings=Timings(1.0, 30.0, 5.0, 50.0),
        reasoning="first water",
    )
    assert server_chats.reply_message("x", "", done("length"), False).status == "done"
    assert server_chats.reply_message("x", "", done("length"), False).reasoning is None
    assert server_chats.reply_message("x", "", done("error"), False).status == "error"
    stopped = server_chats.reply_message("x", "", done("cancelled"), stopped=True)
    assert (stopped.status, stopped.error) == ("stopped", None)
    cut = server_chats.reply_message("x", "", done("cancelled"), stopped=False)
    assert cut.status == "interrupted" and "ended this reply early" in cut.error


def test_a_new_conversation_is_titled_and_named_as_the_page_names_it():
    assert server_chats.title_of("  A soup recipe\nwith leeks") == "A soup recipe"
    assert server_chats.title_of("é" * 100) == "é" * 60  # characters, not bytes
    first, second = server_chats.new_id(), server_chats.new_id()
    assert re.fullmatch(r"c[0-9a-z]{8,9}[0-9a-f]{8}", first) and first != second


def test_a_listed_conversation_is_one_line_whatever_its_title():
    now = datetime(2026, 3, 5, 18, 0)
    today = int(datetime(2026, 3, 5, 14, 2).timestamp() * 1000)
    summary = ConversationSummary("c1", "Soup", 0, today, 3, 3000)
    line = server_chats.summary_line(7, summary, now, here=True)
    assert line == "*  7. Soup" + " " * 44 + "  today 14:02 · 3 KiB"
    hostile = ConversationSummary("c2", "\x1b[2Jwiped\nscreen" + "!" * 100, 0, today, 1, 10)
    line = server_chats.summary_line(8, hostile, now)
    assert "\x1b" not in line and "\n" not in line and "…" in line
    yesterday = int(datetime(2026, 3, 4, 9, 5).timestamp() * 1000)
    assert server_chats._when(yesterday, now) == "yesterday 09:05"
    assert server_chats._when(0, now).startswith("1970-01-0")


def test_a_resumed_conversation_shows_its_last_turns_each_cut_short():
    messages = [StoredMessage("user", f"q{i}") for i in range(5)]
    messages.append(StoredMessage("assistant", "line\n" * 50 + "\x1b]0;title\x07"))
    messages.append(StoredMessage("assistant", "", status="error", error="busy"))
    lines = server_chats.recent(messages)
    assert lines[0] == "  (3 messages before these)"
    assert lines[1:3] == ["you> q3", "you> q4"]
    assert lines[3].startswith("model> line\n") and lines[3].count("\n") == 7
    assert lines[3].endswith(" […]") and "\x1b" not in "".join(lines)
    assert lines[4] == "model> (error: busy)"


def test_the_commands_on_a_server_that_keeps_none_say_so():
    said: list[str] = []
    kept = ServerChats([], lambda text, file=None: said.append(text), ModelPicker(None, print))
    assert asyncio.run(kept.command("/chats")) is True
    assert asyncio.run(kept.command("/resume 2")) is True
    assert asyncio.run(kept.command("/new")) is False  # not ours: the chat client's
    assert asyncio.run(kept.resume("")) is False
    assert said == [server_chats.NOT_KEPT] * 3


def test_a_number_is_what_a_person_types_as_one():
    assert [server_chats._number(t) for t in ("1", "42", "0", "007", "123456789", "1e3")] == [
        1,
        42,
        None,
        7,
        None,
        None,
    ]
    assert server_chats._number("٣") is None  # a digit, but not one typed for a list
