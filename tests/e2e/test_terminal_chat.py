"""The terminal chat client, driven against the real server with the real model."""

from __future__ import annotations

import asyncio
import io

import pytest

from tui.chat import ChatClient

pytestmark = pytest.mark.model


async def script(*lines: str):
    for line in lines:
        yield line


def make_client(live, user: str, *lines: str, **kw) -> tuple[ChatClient, io.StringIO]:
    out = io.StringIO()
    client = ChatClient(
        live.url, user, max_tokens=24, temperature=0, lines=script(*lines), out=out, **kw
    )
    return client, out


def test_two_people_chat_at_the_same_time(live):
    alice, alice_out = make_client(live, "alice", "What is the capital of France?", "/quit")
    bob, bob_out = make_client(live, "bob", "Why is the sky blue?", "/quit")

    async def both():
        return await asyncio.gather(alice.run(), bob.run())

    assert asyncio.run(both()) == [0, 0]
    for out in (alice_out.getvalue(), bob_out.getvalue()):
        assert "Connected to gemma-3-270m" in out
        assert "model> " in out and "TTFT" in out and "tokens/s" in out
    live.wait_idle()


def test_history_is_kept_and_new_starts_over(live):
    client, out = make_client(live, "carol", "Hello!", "How are you?")
    assert asyncio.run(client.run()) == 0
    assert [m.role for m in client.history] == ["user", "assistant", "user", "assistant"]
    client, out = make_client(live, "carol", "Hello!", "/new", "Again")
    assert asyncio.run(client.run()) == 0
    assert "(new conversation)" in out.getvalue()
    assert [m.content for m in client.history if m.role == "user"] == ["Again"]


def test_ctrl_c_cancels_the_reply_not_the_program(live):
    client, out = make_client(live, "dan", "Tell me a very long story.", "Still there?")
    client.max_tokens = 2000

    async def run_and_interrupt():
        task = asyncio.create_task(client.run())
        async with asyncio.timeout(60):
            while "model> " not in out.getvalue() or len(out.getvalue().split("model> ")[1]) < 20:
                await asyncio.sleep(0.02)
        client.interrupt()  # what the SIGINT handler calls
        return await task

    assert asyncio.run(run_and_interrupt()) == 0
    text = out.getvalue()
    assert "cancelled" in text
    assert text.count("model> ") == 2  # and the conversation went on
    live.wait_idle()


def test_unreachable_server_is_a_clear_message():
    out = io.StringIO()
    client = ChatClient("ws://127.0.0.1:9", "eve", lines=script(), out=out)
    assert asyncio.run(client.run()) == 1
    assert "nothing listens at ws://127.0.0.1:9: start a server" in out.getvalue()


def test_a_chat_longer_than_the_context_gets_a_notice_line():
    """The server drops the oldest turns of a chat too long for its context; the client says so
    under the reply (the paced fake runner: only the counts matter here)."""
    from localserve.bench.fake_server import FakeServer

    server = FakeServer(n_ctx=256)
    try:
        lines = [f"question {turn}: " + "word " * 60 for turn in range(4)]
        client, out = make_client(server, "erin", *lines)
        assert asyncio.run(client.run()) == 0
        notices = [line for line in out.getvalue().splitlines() if "left out" in line]
        assert notices and all("oldest messages were left out" in n for n in notices), notices
        assert "left out" not in out.getvalue().split("model> ")[1]  # the first turn fits
        assert len(client.history) == 8  # the client keeps it all; the server sends less
    finally:
        server.close()


def test_reasoning_is_printed_apart_before_the_answer():
    """A thinking model's reasoning (a scripted reply on a runner whose template reads
    `<think>`): each of its lines starts "thinking: ", the answer comes on a line of its own,
    and only the answer goes into the history the model is sent again. Dimmed on a terminal,
    plain (no escape codes) when the output is not one."""
    from localserve.bench.fake_server import FakeServer
    from tests.support.fakes import ScriptedRunner

    reply = "<think>\nFirst a thought.\nThen another.\n</think>\n\nThe answer is 4."
    pieces = [reply[i : i + 3] for i in range(0, len(reply), 3)]  # tags split across tokens
    runner = ScriptedRunner(
        n_ctx=4096, n_seq_max=8, step_s=0.001, reply=pieces, template_source="<think>"
    )
    server = FakeServer(runner=runner)
    try:
        client, out = make_client(server, "fay", "What is 2 + 2?", "And 3 + 3?")
        client.max_tokens = 200
        assert asyncio.run(client.run()) == 0
        text = out.getvalue()
        assert "\x1b[" not in text
        first = text.split("model> ")[1].splitlines()
        assert first[:3] == [
            "thinking: First a thought.",
            "thinking: Then another.",
            "The answer is 4.",
        ]
        assert [m.content for m in client.history if m.role == "assistant"] == [
            "The answer is 4."
        ] * 2
        client, out = make_client(server, "fay", "What is 2 + 2?", color=True)
        client.max_tokens = 200
        assert asyncio.run(client.run()) == 0
        shown = out.getvalue().split("model> ")[1].replace("\x1b[0m\x1b[2m", "")  # piece by piece
        dim = "\x1b[2mthinking: First a thought.\nthinking: Then another.\x1b[0m"
        assert shown.startswith(dim + "\nThe answer is 4.\n")
    finally:
        server.close()
