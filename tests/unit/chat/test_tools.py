"""chat/tools.py: tool specs bounded, tool_choice checked, the forced-call grammar valid for
llguidance in every format (what it forces is checked on the real model in
tests/e2e/test_tool_calling.py)."""

from __future__ import annotations

import llguidance
import pytest

from localserve.chat.tools import (
    MAX_TOOLS,
    ToolChoice,
    ToolsError,
    check_tool_choice,
    check_tools,
    forced_call_grammar,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def test_tools_come_back_normalized():
    assert check_tools([WEATHER, TIME]) == [
        WEATHER,
        {"type": "function", "function": {"name": "get_time"}},
    ]


@pytest.mark.parametrize(
    "tools, words",
    [
        ("get_weather", "must be a list"),
        ([WEATHER] * 2, "offered twice"),
        ([{"type": "retrieval"}], "only {"),
        ([{"type": "function", "function": {"name": "no spaces"}}], "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "x", "parameters": []}}], "parameters"),
        ([{"type": "function", "function": {"name": "x", "description": 3}}], "description"),
        (
            [{"type": "function", "function": {"name": f"f{i}"}} for i in range(MAX_TOOLS + 1)],
            "at most 128",
        ),  # fmt: skip
    ],
)
def test_bad_tools_are_refused_naming_the_field(tools, words):
    with pytest.raises(ToolsError, match=words.replace("[", r"\[").replace("{", r"\{")):
        check_tools(tools)


def test_tool_choice():
    tools = check_tools([WEATHER, TIME])
    assert check_tool_choice(None, tools) == ToolChoice("auto")
    assert check_tool_choice(None, []) == ToolChoice("none")
    assert check_tool_choice("required", tools).is_forced
    assert not check_tool_choice("none", tools).shows_tools
    named = {"type": "function", "function": {"name": "get_time"}}
    assert check_tool_choice(named, tools) == ToolChoice("function", "get_time")
    for bad, words in [
        ({"type": "function", "function": {"name": "nope"}}, "not one of the tools"),
        ("sometimes", '"auto", "none"'),
    ]:
        with pytest.raises(ToolsError, match=words):
            check_tool_choice(bad, tools)
    with pytest.raises(ToolsError, match="needs tools"):
        check_tool_choice("required", [])


@pytest.mark.parametrize("tool_format", ["hermes", "transcript", "llama3", "gemma", "mistral"])
@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("name", [None, "get_weather"])
def test_the_forced_call_grammar_is_valid_in_every_format(tool_format, parallel, name):
    text = forced_call_grammar(tool_format, check_tools([WEATHER, TIME]), name, parallel)
    is_error, warnings = llguidance.LLMatcher.validate_grammar_with_warnings(
        llguidance.grammar_from("lark", text), None
    )
    assert not is_error and not warnings, (text, warnings)
    assert ('"get_time"' in text) is (name is None)


def _bytes_tokenizer() -> llguidance.LLTokenizer:
    """One token per byte, and an end: enough to walk a grammar byte by byte."""
    from llguidance._tokenizer import TokenizerWrapper

    class _Bytes:
        eos_token_id, bos_token_id, special_token_ids = 256, None, [256]
        tokens = [bytes([i]) for i in range(256)] + [b"\xff<end>"]

        def __call__(self, data: bytes) -> list[int]:
            return self.tokenize(data)

        def tokenize(self, data: bytes | str) -> list[int]:
            return list(data.encode() if isinstance(data, str) else data)

    return llguidance.LLTokenizer(TokenizerWrapper(_Bytes()))


@pytest.mark.parametrize(
    "tool_format, opening",
    [
        ("hermes", '<tool_call>\n{"name":"get_weather","arguments":{'),
        ("transcript", '<tool_call>{"name":"get_weather","arguments":{'),
        ("llama3", '{"name":"get_weather","parameters":{'),
        ("mistral", '[TOOL_CALLS][{"name":"get_weather","arguments":{'),
    ],
)
def test_a_forced_call_has_no_room_for_whitespace_runs(tool_format, opening):
    """A model could loop in whitespace inside the JSON (the reply then ends by length, not
    with a call): the forced grammars' JSON is compact."""
    grammar = llguidance.grammar_from(
        "lark", forced_call_grammar(tool_format, check_tools([WEATHER]))
    )
    matcher = llguidance.LLMatcher(_bytes_tokenizer(), grammar)
    assert matcher.consume_tokens(list(opening.encode())), matcher.get_error()
    assert matcher.validate_tokens(list(b'"city"')) == 6
    assert matcher.validate_tokens(list(b" ")) == 0 and matcher.validate_tokens(list(b"\n")) == 0


def test_a_forced_call_bounds_the_tool_schemas_as_response_format_does():
    from localserve.chat.constraints import ConstraintError

    hostile = {"type": "function", "function": {"name": "f", "parameters": {"not": {}}}}
    with pytest.raises(ConstraintError, match="f.parameters: the keyword 'not'"):
        forced_call_grammar("hermes", check_tools([hostile]))
    sneaky = {"type": "object", "x-guidance": {"whitespace_flexible": True}}
    with pytest.raises(ConstraintError, match="x-guidance"):
        forced_call_grammar(
            "hermes", check_tools([{"function": {"name": "f", "parameters": sneaky}}])
        )


def test_a_format_without_a_forced_form_is_said():
    with pytest.raises(ToolsError, match="not supported for the 'deepseek' tool format"):
        forced_call_grammar("deepseek", check_tools([WEATHER]))
