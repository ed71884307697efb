"""Reasoning split from the answer: each format whole and a character at a time, any split the
same as whole, a block the prompt opened, an unclosed block, tags that are only nearly tags."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localserve.chat.reasoning import (
    FORMATS,
    ReasoningDelta,
    ReasoningParser,
    detect_reasoning_format,
    new_reasoning_parser,
    prompt_opens_reasoning,
)


def split(fmt: str, pieces, started: bool = False) -> tuple[str, str]:
    """(reasoning, content) of a reply fed as `pieces`."""
    parser = ReasoningParser(*FORMATS[fmt], started=started)
    parts = [parser.feed(p) for p in pieces] + [parser.finish()]
    return "".join(p.reasoning for p in parts), "".join(p.content for p in parts)


# (format, started, reply, reasoning, content)
CASES = [
    (
        "think",
        False,
        "<think>\nThe user greets me.\n</think>\n\nHello!",
        "The user greets me.\n",
        "Hello!",
    ),
    ("think", False, "\n<think>\n\n</think>\n\nHello!", "", "Hello!"),  # Qwen 3, thinking off
    (
        "think",
        True,
        "Okay, 2+2 is 4.\n</think>\n\n**4**",
        "Okay, 2+2 is 4.\n",
        "**4**",
    ),  # R1 distill
    ("think", False, "Hello! No thinking today.", "", "Hello! No thinking today."),
    (
        "think",
        False,
        "<think>Still thinking when the tokens ran out",
        "Still thinking when the tokens ran out",
        "",
    ),
    ("think", True, "Thinking, cut off at </thi", "Thinking, cut off at </thi", ""),
    (
        "think",
        False,
        "<thinking>is not the tag</thinking>",
        "",
        "<thinking>is not the tag</thinking>",
    ),
    ("think", False, "<think>a</think>b <think>c</think>", "a", "b <think>c</think>"),
    ("think", False, "<think>1 < 2 and </thin k> </think>done", "1 < 2 and </thin k> ", "done"),
    (
        "think",
        False,
        "<think>Ça va ? 🤔 思考</think>Très bien 👍",
        "Ça va ? 🤔 思考",
        "Très bien 👍",
    ),
    ("think", False, "Answer first <think>then</think>", "", "Answer first <think>then</think>"),
    ("think", False, "<thi", "", "<thi"),
    (
        "magistral",
        False,
        "[THINK]Let me see.[/THINK]The answer is 4.",
        "Let me see.",
        "The answer is 4.",
    ),
    ("magistral", False, "[THINK]unclosed [/THIN", "unclosed [/THIN", ""),
    ("magistral", False, "[THIN", "", "[THIN"),
]


@pytest.mark.parametrize(("fmt", "started", "text", "reasoning", "content"), CASES)
def test_each_format_whole_and_a_character_at_a_time(fmt, started, text, reasoning, content):
    assert split(fmt, [text], started) == (reasoning, content)
    assert split(fmt, list(text), started) == (reasoning, content)


def test_deltas_come_out_as_soon_as_they_are_clear():
    parser = ReasoningParser("<think>", "</think>")
    assert parser.feed("<th") == ReasoningDelta("", "")
    assert parser.feed("ink>\nHmm, ") == ReasoningDelta("Hmm, ", "")
    assert parser.is_reasoning
    assert parser.feed("ok.</") == ReasoningDelta("ok.", "")
    assert parser.feed("think>\n\nYes") == ReasoningDelta("", "Yes")
    assert not parser.is_reasoning
    assert parser.feed(" </think>") == ReasoningDelta("", " </think>")
    assert parser.finish() == ReasoningDelta("", "")


def test_what_is_held_is_at_most_a_tag():
    parser = ReasoningParser("<think>", "</think>", started=True)
    for c in "x" * 50 + "</think"[:-1]:
        parser.feed(c)
        assert len(parser._held) < len("</think>")


def test_the_prompt_says_whether_the_reply_starts_inside_the_reasoning():
    r1 = "<｜User｜>2+2?<｜Assistant｜><think>\n"
    assert prompt_opens_reasoning(r1, "think")
    qwen3_off = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert not prompt_opens_reasoning(qwen3_off, "think")
    assert not prompt_opens_reasoning(r1 + "</think>", "think")  # the distill, thinking off
    assert not prompt_opens_reasoning("<|im_start|>assistant\n", "think")
    assert prompt_opens_reasoning("[INST]q[/INST][THINK]", "magistral")
    parser = new_reasoning_parser("think", r1)
    assert parser.feed("Four.</think>4") == ReasoningDelta("Four.", "4")
    assert new_reasoning_parser("think").feed("Four.</think>4") == ReasoningDelta(
        "", "Four.</think>4"
    )


def test_the_format_is_read_from_the_template():
    assert detect_reasoning_format("{{ '<think>\\n' }}{% if enable_thinking %}") == "think"
    assert detect_reasoning_format("[SYSTEM_PROMPT]...[THINK]...[/THINK]... <think>") == "magistral"
    assert detect_reasoning_format("{{ message.content }}") is None
    assert detect_reasoning_format(None) is None
    with pytest.raises(ValueError, match="unknown reasoning format"):
        new_reasoning_parser("harmony")
    with pytest.raises(ValueError, match="must not be empty"):
        ReasoningParser("", "</think>")


def test_the_parser_is_used_once():
    parser = new_reasoning_parser("think")
    parser.finish()
    with pytest.raises(ValueError, match="finished"):
        parser.feed("x")


SPACE = " \t\r\n"
NOISE = ["<think>", "</think>", "[THINK]", "[/THINK]", "<", "</", "[", "/", "\n", " ", "a", "é🤔"]


def cut(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(0, 1000), max_size=30))
def test_any_split_of_a_reply_gives_the_same_as_whole(case, cuts):
    fmt, started, text, reasoning, content = case
    assert split(fmt, cut(text, cuts), started) == (reasoning, content)


@settings(max_examples=500, deadline=None)
@given(
    fmt=st.sampled_from(sorted(FORMATS)),
    started=st.booleans(),
    text=st.lists(st.sampled_from(NOISE) | st.text(max_size=3), max_size=30).map("".join),
    cuts=st.lists(st.integers(0, 1000), max_size=20),
)
def test_any_text_any_split_splits_as_the_rules_say(fmt, started, text, cuts):
    assert split(fmt, [text], started) == oracle(fmt, started, text)
    assert split(fmt, cut(text, cuts), started) == oracle(fmt, started, text)


def oracle(fmt: str, started: bool, text: str) -> tuple[str, str]:
    """The module docstring's rules, on the whole text at once."""
    open_tag, close_tag = FORMATS[fmt]
    rest = text.lstrip(SPACE)
    if not started:
        if not rest.startswith(open_tag):
            return "", rest
        rest = rest[len(open_tag) :]
    end = rest.find(close_tag)
    if end < 0:
        return rest.lstrip(SPACE), ""
    return rest[:end].lstrip(SPACE), rest[end + len(close_tag) :].lstrip(SPACE)
