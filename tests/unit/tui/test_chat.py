"""The terminal chat client (tui/chat.py): the line that tells a user where they stand today.
Its chats with the real server are e2e/test_terminal_chat.py."""

from __future__ import annotations


def test_the_chat_client_says_where_a_user_stands():
    from localserve.protocol.frames import Quota
    from tui.chat import quota_line

    quota = Quota(50_000, 12_345, 37_655, "2026-12-01T00:00:00+01:00")
    assert quota_line(quota) == (
        "Today: 12,345 of your 50,000 tokens used, 37,655 left (resets at 00:00)."
    )
