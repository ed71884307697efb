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


def test_a_format_without_a_forced_form_is_said():
    with pytest.raises(ToolsError, match="not supported for the 'deepseek' tool format"):
        forced_call_grammar("deepseek", check_tools([WEATHER]))
