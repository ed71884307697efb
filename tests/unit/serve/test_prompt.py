"""Chat rendering: transcript and template prompts, and where their system prompt ends."""

from __future__ import annotations

import pytest

from localserve.serve.prompt import PREAMBLE, TRANSCRIPT_STOPS, render_chat


def gemma_like(messages: list[dict[str, str]]) -> str:
    """A template that folds the system prompt into the first user turn, as Gemma's does."""
    out, system = "", ""
    for m in messages:
        if m["role"] == "system":
            system = m["content"] + "\n\n"
        else:
            role = "model" if m["role"] == "assistant" else "user"
            out += f"<start_of_turn>{role}\n{system}{m['content']}<end_of_turn>\n"
            system = ""
    return out + "<start_of_turn>model\n"


def test_transcript_without_system_prompt_shares_the_preamble():
    r = render_chat([("user", "Hi")], "transcript", gemma_like)
    assert r.text == f"{PREAMBLE}\n\nUser: Hi\nAssistant:" and r.stops == TRANSCRIPT_STOPS
    assert r.text[: r.system_chars] == PREAMBLE + "\n\n" and r.is_default_system


def test_a_chats_own_system_prompt_is_not_the_default():
    r = render_chat([("system", "Be brief."), ("user", "Hi")], "transcript", gemma_like)
    assert r.text[: r.system_chars] == "Be brief.\n\n" and not r.is_default_system


def test_the_configured_system_prompt_is_the_default_and_applies_when_none_is_given():
    for messages in ([("user", "Hi")], [("system", "Be brief."), ("user", "Hi")]):
        r = render_chat(messages, "transcript", gemma_like, system_prompt="Be brief.")
        assert r.text.startswith("Be brief.\n\nUser: Hi") and r.is_default_system
        assert r.text[: r.system_chars] == "Be brief.\n\n"


@pytest.mark.parametrize("question", ["Hi", "a", "b", "What is 2 + 2?"])
def test_template_system_part_is_what_every_chat_with_it_starts_with(question):
    messages = [("system", "Be brief."), ("user", question), ("assistant", "4"), ("user", "Ok")]
    r = render_chat(messages, "template", gemma_like)
    assert r.text[: r.system_chars] == "<start_of_turn>user\nBe brief.\n\n"
    assert not r.is_default_system and r.stops == ()


def test_template_without_system_prompt_has_no_shared_part():
    r = render_chat([("user", "Hi")], "template", gemma_like)
    assert r.system_chars == 0 and r.is_default_system
