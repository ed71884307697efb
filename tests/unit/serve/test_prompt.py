"""Chat rendering (localserve/serve/prompt.py): transcript and template prompts, where their
system prompt ends, and the prompt builder's bounds (too long, the tokenizer's priority)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from localserve.chat.messages import PromptMessage, ToolCallMade
from localserve.chat.templates import ChatTemplate
from localserve.runners.fake import BOS, FakeRunner
from localserve.serve.prompt import (
    GENERIC_TOOLS_HOW,
    PREAMBLE,
    TRANSCRIPT_STOPS,
    PromptBuilder,
    PromptTooLong,
    render_chat,
)
from tests.support.paths import ROOT

NO_MARKS = ROOT / "tests" / "data" / "templates" / "no-tool-marks.jinja"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


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


def test_only_the_transcript_drops_the_replys_leading_space():
    assert render_chat([("user", "Hi")], "transcript", gemma_like).strip_space
    assert not render_chat([("user", "Hi")], "template", gemma_like).strip_space


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


def no_marks():
    """A template that shows no tools and knows only system, user and assistant, in turn."""
    template = ChatTemplate(NO_MARKS.read_text(encoding="utf-8"), "<s>", "</s>")
    return lambda chat, tools=None, **kwargs: template.render(chat, tools, kwargs)


def test_a_template_that_shows_no_tools_is_given_them_in_the_system_message():
    apply = no_marks()
    plain = render_chat([("user", "Weather?")], "template", apply, tools=[WEATHER])
    assert "get_weather" not in plain.text  # the template drops them: `auto` is never offered
    r = render_chat(
        [("system", "Be brief."), ("user", "Weather?")], "template", apply, tools=[WEATHER],
        describe_tools=True,
    )  # fmt: skip
    system, _, rest = r.text.removeprefix("<s>").partition("\n\n### Instruction:\n")
    assert system.startswith("Be brief.\n\nYou can call these functions")
    assert '"name": "get_weather", "description": "The weather in a city"' in system
    assert system.endswith(GENERIC_TOOLS_HOW) and rest == "Weather?\n\n### Response:\n"
    alone = render_chat([("user", "Weather?")], "template", apply, tools=[WEATHER],
                        describe_tools=True)  # fmt: skip
    assert alone.text.startswith("<s>You can call these functions")


def test_calls_and_results_are_written_into_turns_the_template_knows():
    """A call as the reply would write it; results (two in a row here) one user turn: the
    template refuses a `tool` role and two user turns in a row."""
    calls = (ToolCallMade("c1", "get_weather", '{"city": "Paris"}'),
             ToolCallMade("c2", "get_weather", '{"city": "Rome"}'))  # fmt: skip
    chat = [
        PromptMessage("user", "Weather in Paris and Rome?"),
        PromptMessage("assistant", "Checking.", calls),
        PromptMessage("tool", "18 C", (), "c1", "get_weather"),
        PromptMessage("tool", "21 C", (), "c2", "get_weather"),
    ]
    apply = no_marks()
    with pytest.raises(ValueError, match="roles"):
        render_chat(chat, "template", apply, tools=[WEATHER])
    r = render_chat(chat, "template", apply, tools=[WEATHER], describe_tools=True)
    assert r.text.endswith(
        "### Response:\nChecking.\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '{"name": "get_weather", "arguments": {"city": "Rome"}}</s>\n\n'
        "### Instruction:\nResult of get_weather: 18 C\n\nResult of get_weather: 21 C\n\n"
        "### Response:\n"
    )
    # a chat without tools or calls is the template's alone
    bare = [("user", "Hi")]
    assert render_chat(bare, "template", apply, describe_tools=True) == render_chat(
        bare, "template", apply
    )


def test_the_prompt_builder_says_too_long_once_with_both_numbers():
    runner = FakeRunner(n_ctx=64)
    builder = PromptBuilder(runner.tokenize, runner.apply_chat_template, 64, "template")
    try:
        prompt = asyncio.run(builder.chat([("user", "hello there")]))
        assert prompt.tokens[0] == BOS and prompt.system_tokens == 0
        with pytest.raises(PromptTooLong) as e:
            asyncio.run(builder.chat([("user", "word " * 100)]))
        assert (e.value.num_tokens, e.value.n_ctx) == (103, 64)  # BOS, <user>, 100, <model>
        with pytest.raises(PromptTooLong, match="over"):  # probed, not tokenized whole
            asyncio.run(builder.text("w " * 100_000))
        with pytest.raises(ValueError, match="role"):
            asyncio.run(builder.chat([("wizard", "hi")]))
    finally:
        builder.shutdown()


def test_given_the_reply_length_the_builder_drops_the_oldest_turns_and_says_how_many():
    runner = FakeRunner(n_ctx=256)
    builder = PromptBuilder(runner.tokenize, runner.apply_chat_template, 256, "template")
    turns = [("user", "word " * 20), ("assistant", "word " * 20)] * 8
    chat = [("system", "Be brief."), *turns, ("user", "last question")]
    try:
        with pytest.raises(PromptTooLong):  # refuse: as before
            asyncio.run(builder.chat(chat))
        prompt = asyncio.run(builder.chat(chat, reply_tokens=32))
        assert len(prompt.tokens) + 32 <= 256 and prompt.num_dropped_messages % 2 == 0
        assert 0 < prompt.num_dropped_messages < len(turns)
        kept = chat[:1] + chat[1 + prompt.num_dropped_messages :]
        assert prompt.tokens == runner.tokenize(
            runner.apply_chat_template([{"role": r, "content": c} for r, c in kept])
        )
        assert prompt.system_tokens > 0  # the system prompt is still shared
        # max_tokens over half the context: room for half is kept, and the latest turns
        prompt = asyncio.run(builder.chat(chat, reply_tokens=250))
        assert prompt.num_dropped_messages < len(turns) and len(prompt.tokens) + 128 <= 256
        # the newest turn alone leaves no room for max_tokens: the reply gets what is left
        big = [*chat[:-1], ("user", "word " * 200)]
        prompt = asyncio.run(builder.chat(big, reply_tokens=100))
        assert prompt.num_dropped_messages == len(turns) and len(prompt.tokens) < 256
        with pytest.raises(PromptTooLong):  # the newest turn alone does not fit: refused
            asyncio.run(builder.chat([*chat, ("user", "word " * 300)], reply_tokens=32))
        assert asyncio.run(builder.chat(chat[-3:], reply_tokens=32)).num_dropped_messages == 0
    finally:
        builder.shutdown()


def test_a_chat_too_long_to_tokenize_whole_is_still_cut_within_a_step_of_what_fits():
    """Far past the context the whole chat is only probed (its head tokenized): its count is the
    head's scaled to the whole, so the turns' shares (a word and its role marker: 2 tokens a
    message here) are not taken for the head's fraction of that."""
    n_ctx, reply = 256, 32
    runner = FakeRunner(n_ctx=n_ctx)
    builder = PromptBuilder(runner.tokenize, runner.apply_chat_template, n_ctx, "template")
    chat = [(("user", "assistant")[i % 2], f"w{i}") for i in range(3001)]  # 12,004 characters
    try:
        for num_messages in range(2001, 3002, 100):
            prompt = asyncio.run(builder.chat(chat[:num_messages], reply_tokens=reply))
            room = n_ctx - reply - len(prompt.tokens)
            assert 0 <= room <= n_ctx // 4 + 4, (num_messages, room)  # a step and a turn
    finally:
        builder.shutdown()


def test_prompts_within_an_allowance_are_built_at_normal_priority():
    from localserve.serve import prompt as prompt_module

    runner = FakeRunner(n_ctx=100_000)
    now = [0.0]
    builder = PromptBuilder(
        runner.tokenize, runner.apply_chat_template, 100_000, "template", clock=lambda: now[0]
    )
    per_s = prompt_module.PROMPT_CHARS_PER_S
    threads = []
    tokenize = builder.tokenize
    builder.tokenize = lambda text: (
        threads.append(threading.current_thread().name) or tokenize(text)
    )
    quick = "localserve-tokenize-now_0"
    try:
        asyncio.run(builder.chat([("user", "word " * 2000)]))  # 10,000 characters
        asyncio.run(builder.text("x" * (per_s - 10_000)))  # the rest of this second's allowance
        assert threads == [quick, quick]
        asyncio.run(builder.text("y" * 100))  # over it: the low-priority pool
        assert threads[-1].startswith("localserve-tokenize_")
        now[0] += 0.5  # half the allowance back
        asyncio.run(builder.text("z" * (per_s // 2)))
        assert threads[-1] == quick
        now[0] += 100.0  # at most one second's worth is saved up
        asyncio.run(builder.text("w" * (per_s + 1)))
        assert threads[-1] != quick
    finally:
        builder.shutdown()


def test_a_template_that_does_not_render_is_refused_at_start_naming_the_key():
    from localserve.config import ConfigError
    from localserve.serve.prompt import check_template

    def unknown(messages):
        raise ValueError("chat_template: llama.cpp does not know 'gemmma'")

    def none(messages):
        raise ValueError("chat_template: the model has none; set one in models.toml")

    with pytest.raises(ConfigError) as e:
        check_template("g", "template", unknown)
    assert str(e.value).startswith(
        "[models.g] chat_template: llama.cpp does not know 'gemmma'; set chat_template to one of "
        "llama.cpp's built-in names (chatml, llama3, gemma"
    )
    assert str(e.value).endswith('or chat_format = "transcript"')
    with pytest.raises(ConfigError, match=r"^\[models.g\] chat_template: the model has none; set"):
        check_template("g", "template", none)
    check_template("g", "transcript", none)  # the transcript needs no template
    check_template("g", "template", lambda messages: "<start>Hello")


def test_a_jinja_template_that_cannot_render_a_simple_chat_is_refused_at_start():
    from localserve.chat.templates import ChatTemplate
    from localserve.config import ConfigError
    from localserve.serve.prompt import check_template

    template = ChatTemplate("{{ raise_exception('System message required') }}")
    with pytest.raises(ConfigError) as e:
        check_template("g", "template", template.render)
    assert str(e.value).startswith(
        "[models.g] chat_template: the template refused this chat: System message required; set"
    )
