"""chat/tools.py: tool specs bounded, tool_choice checked, the forced-call grammar valid for
llguidance in every format (what it forces is checked on the real model in
tests/e2e/test_tool_calling.py)."""

from __future__ import annotations

import json

import llguidance
import pytest

from localserve.chat.constraints import meant_schema
from localserve.chat.tools import (
    MAX_TOOLS,
    ToolChoice,
    ToolsError,
    check_tool_choice,
    check_tools,
    forced_call_grammar,
)
from tests.support.grammar import bytes_tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


FORCED_FORMATS = ["hermes", "transcript", "llama3", "gemma", "mistral", "generic"]


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


@pytest.mark.parametrize("tool_format", FORCED_FORMATS)
@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("name", [None, "get_weather"])
def test_the_forced_call_grammar_is_valid_in_every_format(tool_format, parallel, name):
    text = forced_call_grammar(tool_format, check_tools([WEATHER, TIME]), name, parallel)
    is_error, warnings = llguidance.LLMatcher.validate_grammar_with_warnings(
        llguidance.grammar_from("lark", text), None
    )
    assert not is_error and not warnings, (text, warnings)
    assert ('"get_time"' in text) is (name is None)


@pytest.mark.parametrize(
    "tool_format, opening",
    [
        ("hermes", '<tool_call>\n{"name":"get_weather","arguments":{'),
        ("transcript", '<tool_call>{"name":"get_weather","arguments":{'),
        ("llama3", '{"name":"get_weather","parameters":{'),
        ("mistral", '[TOOL_CALLS][{"name":"get_weather","arguments":{'),
        ("generic", '{"name":"get_weather","arguments":{'),
    ],
)
def test_a_forced_call_has_no_room_for_whitespace_runs(tool_format, opening):
    """A model could loop in whitespace inside the JSON (the reply then ends by length, not
    with a call): the forced grammars' JSON is compact."""
    grammar = llguidance.grammar_from(
        "lark", forced_call_grammar(tool_format, check_tools([WEATHER]))
    )
    matcher = llguidance.LLMatcher(bytes_tokenizer(), grammar)
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


def _json_blocks(grammar: str) -> list[dict]:
    """The JSON schemas a Lark grammar embeds as %json{...}."""
    decoder, blocks, at = json.JSONDecoder(), [], 0
    while (at := grammar.find("%json", at)) >= 0:
        schema, end = decoder.raw_decode(grammar, at + len("%json"))
        blocks.append(schema)
        at = end
    return blocks


@pytest.mark.parametrize("tool_format", FORCED_FORMATS)
def test_the_forced_call_grammar_holds_the_tools_own_schema_as_meant(tool_format):
    """The arguments' schema in the grammar is the tool's parameters as the server means them
    (closed, numbers bounded), not something looser: read back out of the grammar's text."""
    [block] = _json_blocks(forced_call_grammar(tool_format, check_tools([WEATHER])))
    call = block["items"] if tool_format == "mistral" else block
    key = "parameters" if tool_format in ("llama3", "gemma") else "arguments"
    assert call["properties"]["name"] == {"const": "get_weather"}
    assert call["additionalProperties"] is False and call["required"] == ["name", key]
    ref = call["properties"][key]["$ref"]
    assert block["$defs"][ref.removeprefix("#/$defs/")] == meant_schema(
        WEATHER["function"]["parameters"]
    )


def _writes(grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(bytes_tokenizer(), llguidance.grammar_from("lark", grammar))
    tokens = list(text.encode())
    return matcher.validate_tokens(tokens) == len(tokens) and (
        matcher.consume_tokens(tokens) and matcher.is_accepting()
    )


CALL = '{"name":"get_weather","parameters":{"city":"Paris"}}'


def test_a_forced_call_is_one_call_unless_parallel_calls_are_asked_for():
    one = forced_call_grammar("gemma", check_tools([WEATHER]))
    several = forced_call_grammar("gemma", check_tools([WEATHER]), parallel=True)
    assert _writes(one, CALL) and not _writes(one, CALL + "; " + CALL)
    assert _writes(several, CALL + "; " + CALL)
    mistral = forced_call_grammar("mistral", check_tools([WEATHER]))
    two = '[TOOL_CALLS][{"name":"get_weather","arguments":{"city":"P"}},' * 2
    assert not _writes(mistral, two[:-1] + "]")


def test_a_forced_call_has_no_key_the_schema_does_not_name():
    grammar = forced_call_grammar("gemma", check_tools([WEATHER]))
    assert not _writes(grammar, '{"name":"get_weather","parameters":{"city":"P","type":"x"}}')
    assert not _writes(grammar, '{"name":"get_weather","parameters":{"city":"P"},"id":1}')
    counted = {
        "type": "function",
        "function": {
            "name": "count",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
        },
    }
    grammar = forced_call_grammar("gemma", check_tools([counted]))
    assert _writes(grammar, '{"name":"count","parameters":{"n":' + "7" * 16 + "}}")
    assert not _writes(grammar, '{"name":"count","parameters":{"n":' + "7" * 17 + "}}")


def test_a_tools_own_definitions_resolve_inside_the_call():
    """A pydantic model's nested models come as `$defs` and `$ref`s into them: moved into
    the call's schema, they must still point at their definitions."""
    nested = {
        "type": "object",
        "properties": {"where": {"$ref": "#/$defs/Place"}},
        "required": ["where"],
        "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}}},
    }
    tools = check_tools([{"function": {"name": "go", "parameters": nested}}, TIME])
    grammar = forced_call_grammar("gemma", tools)
    assert _writes(grammar, '{"name":"go","parameters":{"where":{"city":"Rome"}}}')
    assert not _writes(grammar, '{"name":"go","parameters":{"where":{"town":"Rome"}}}')
    assert _writes(grammar, '{"name":"get_time","parameters":{}}')  # no parameters: any object
