"""The terminal chat client (tui/chat.py): the line that tells a user where they stand today, the
notice of a chat shortened to fit the context, its own commands (/help, an unknown /word, Ctrl-C
at the prompt) and how it reads lines not typed. Its chats with the real server are
e2e/test_terminal_chat.py."""

from __future__ import annotations

import asyncio


def test_the_chat_client_says_where_a_user_stands():
    from localserve.protocol.frames import Quota
    from tui.chat import quota_line

    quota = Quota(50_000, 12_345, 37_655, "2026-12-01T00:00:00+01:00")
    assert quota_line(quota) == (
        "Today: 12,345 of your 50,000 tokens used, 37,655 left (resets at 00:00)."
    )


def test_the_chat_client_says_when_the_oldest_messages_were_left_out():
    from tui.chat import dropped_line

    assert dropped_line(6).strip() == (
        "[the 6 oldest messages were left out: the chat is longer than the model's context]"
    )
    assert "the oldest message was left out" in dropped_line(1)


class Said:
    """A ChatClient's turns, recorded instead of sent (no server: the client's own commands)."""

    def __init__(self, *lines: str, echo: bool = False, wait: bool = False) -> None:
        import io

        from tui.chat import ChatClient

        async def typed():
            for line in lines:
                yield line
            if wait:  # a person who types nothing more: the prompt waits
                await asyncio.Event().wait()

        self.out = io.StringIO()
        self.client = ChatClient("ws://x", "ann", lines=typed(), out=self.out, echo=echo)
        self.sent: list[str] = []

        async def ask(text: str) -> bool:
            self.sent.append(text)
            return True

        self.client.ask = ask

    def run(self, interrupt_after: float | None = None) -> int:
        async def converse():
            if interrupt_after is not None:
                asyncio.get_running_loop().call_later(interrupt_after, self.client.interrupt)
            return await self.client._converse()

        return asyncio.run(asyncio.wait_for(converse(), 10))


def test_help_lists_the_clients_commands_and_none_is_sent():
    said = Said("/help", "/new", "hello", "/quit", "never read")
    assert said.run() == 0
    out = said.out.getvalue()
    for command in ("/new", "/chats", "/resume", "/help", "/quit", "Ctrl-C"):
        assert command in out
    assert "(new conversation)" in out
    assert said.sent == ["hello"]


def test_an_unknown_command_is_answered_here_not_sent_to_the_model():
    said = Said("/hlep", "/usr/bin is a folder", "//etc is one too", "/ 2")
    assert said.run() == 0
    assert "unknown command /hlep; /help lists them" in said.out.getvalue()
    # a path or a slash that is not a /word is a message; // sends one /
    assert said.sent == ["/usr/bin is a folder", "/etc is one too", "/ 2"]


def test_ctrl_c_at_the_prompt_leaves_with_status_0():
    said = Said("hello", wait=True)
    assert said.run(interrupt_after=0.2) == 0
    assert said.sent == ["hello"]
    assert said.out.getvalue().endswith("you> \n")


def test_lines_not_from_a_terminal_are_shown_after_the_prompt():
    said = Said("first", "/nope", echo=True)
    assert said.run() == 0
    assert said.out.getvalue().startswith("you> first\nyou> /nope\nunknown command /nope")


def test_a_file_or_dev_null_is_read_directly_a_terminal_or_pipe_is_not(tmp_path):
    import os

    from tui.chat import is_file_like

    path = tmp_path / "lines.txt"
    path.write_text("a\n")
    with open(path) as f, open(os.devnull) as null:
        assert is_file_like(f) and is_file_like(null)
    r, w = os.pipe()
    with os.fdopen(r) as pipe, os.fdopen(w, "w"):
        assert not is_file_like(pipe)


def test_the_line_under_a_reply_says_how_many_tokens_came_as_kept_drafts():
    from localserve.protocol.frames import Finished, ReplyUsage, Timings
    from tui.chat import _summary

    usage = ReplyUsage(12, 40, 0)
    drafted = Finished("c1", "length", usage, Timings(5, 90, 20, 900, None, 30, 22))
    plain = Finished("c1", "length", usage, Timings(5, 90, 20, 900))
    assert "40 tokens · 22 drafted · length" in _summary(drafted)
    assert "drafted" not in _summary(plain)
