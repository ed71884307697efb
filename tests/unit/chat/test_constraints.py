"""Schemas as client input: bounded, checked keyword by keyword, compiled off the loop, cached."""

from __future__ import annotations

import asyncio
import time

import llguidance
import pytest

from localserve.chat import constraints
from localserve.chat.constraints import (
    MAX_DEPTH,
    MAX_ENUM,
    MAX_SCHEMA_BYTES,
    ConstraintCompiler,
    ConstraintError,
    check_schema,
    parse_response_format,
)
from tests.support.grammar import bytes_tokenizer

CITY = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}


def test_response_formats_are_parsed_text_means_none():
    assert parse_response_format(None) == (None, "")
    assert parse_response_format({"type": "text"}) == (None, "")
    assert parse_response_format({"type": "json_object"})[0] == "json_object"
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY, "strict": True}}
    assert parse_response_format(fmt)[0] == "json_schema"
    with pytest.raises(ConstraintError, match="response_format.type"):
        parse_response_format({"type": "yaml"})


@pytest.mark.parametrize(
    "keyword", ["uniqueItems", "not", "if", "contains", "dependentRequired", "x-guidance"]
)
def test_an_unsupported_keyword_is_refused_by_name(keyword):
    with pytest.raises(ConstraintError, match=f"'{keyword}'"):
        check_schema({"type": "object", "properties": {"a": {keyword: {}}}})


def test_hostile_schemas_are_refused_before_compiling():
    deep = {"type": "integer"}
    for _ in range(MAX_DEPTH + 2):
        deep = {"type": "array", "items": deep}
    with pytest.raises(ConstraintError, match="nested deeper"):
        check_schema(deep)
    with pytest.raises(ConstraintError, match="more than"):
        check_schema({"enum": list(range(MAX_ENUM + 1))})
    with pytest.raises(ConstraintError, match="pattern longer"):
        check_schema({"type": "string", "pattern": "a" * 1000})
    with pytest.raises(ConstraintError, match="bytes"):
        check_schema({"description": "x" * MAX_SCHEMA_BYTES})


def test_a_bad_regex_is_refused_by_the_compiler():
    with pytest.raises(ConstraintError, match="refused"):
        ConstraintCompiler().compile_sync("json_schema", {"type": "string", "pattern": "(["})


def test_compiled_constraints_are_cached_by_canonical_text():
    compiler = ConstraintCompiler()
    reordered = dict(reversed(list(CITY.items())))

    async def both():
        fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}}
        a = await compiler.response_format(fmt)
        b = await compiler.json_schema(reordered)
        return a, b

    a, b = asyncio.run(both())
    assert a == b and a.kind == "json_schema" and compiler.num_compiled == 1


def test_a_lark_grammar_may_embed_a_json_schema_for_tool_calls():
    c = ConstraintCompiler().compile_sync(
        "lark", 'start: "<tool_call>" %json{"type": "object"} "</tool_call>"'
    )
    assert c.kind == "lark" and c.grammar


def test_a_compile_past_the_time_bound_is_refused(monkeypatch):
    monkeypatch.setattr(constraints, "_compile", lambda kind, text: time.sleep(0.5))
    compiler = ConstraintCompiler(timeout_s=0.05)
    with pytest.raises(ConstraintError, match="too complex"):
        asyncio.run(compiler.json_schema(CITY))
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}}
    with pytest.raises(ConstraintError, match="^response_format: too complex"):
        asyncio.run(compiler.response_format(fmt))


# --- what the caller meant: closed objects, bounded numbers -------------------------------------


BYTES = bytes_tokenizer()


def takes(schema: dict, text: str) -> bool:
    """Whether the server's grammar for `schema` can write exactly `text` (and end there)."""
    grammar = ConstraintCompiler().compile_sync("json_schema", schema).grammar
    matcher = llguidance.LLMatcher(BYTES, grammar)
    tokens = list(text.encode())
    if matcher.validate_tokens(tokens) < len(tokens):
        return False
    assert matcher.consume_tokens(tokens), matcher.get_error()
    return matcher.is_accepting()


WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "population": {"type": "integer"},
        "area": {"type": "number"},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
    },
    "required": ["city"],
}


def test_an_object_without_additional_properties_has_only_its_own():
    assert takes(WEATHER, '{"city":"Paris"}')
    assert takes(WEATHER, '{"city":"Paris","where":{"lat":48.85}}')
    assert not takes(WEATHER, '{"city":"Paris","type":"object"}')  # a key from the schema
    assert not takes(WEATHER, '{"city":"Paris","where":{"lat":1,"lon":2}}')  # nested too
    defs = {"$defs": {"P": WEATHER}, "type": "array", "items": {"$ref": "#/$defs/P"}}
    assert not takes(defs, '[{"city":"Paris","x":1}]')  # and behind a $ref


def test_additional_properties_are_honoured_when_written():
    assert takes({**WEATHER, "additionalProperties": True}, '{"city":"Paris","type":"object"}')
    typed = {**WEATHER, "additionalProperties": {"type": "boolean"}}
    assert takes(typed, '{"city":"Paris","sunny":true}')
    assert not takes(typed, '{"city":"Paris","sunny":"yes"}')


def test_several_all_of_members_are_left_open_so_their_intersection_holds():
    a = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    b = {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}
    assert takes({"allOf": [a, b]}, '{"a":1,"b":2}')
    assert not takes({"allOf": [a]}, '{"a":1,"b":2}')  # one member is the whole schema


def test_numbers_have_bounded_digits_unless_the_schema_bounds_them():
    assert takes(WEATHER, '{"city":"P","population":' + str(2**53 - 1) + "}")
    assert not takes(WEATHER, '{"city":"P","population":' + str(2**53) + "}")
    assert not takes(WEATHER, '{"city":"P","population":1' + "0" * 16 + "}")  # 10**16
    assert not takes(WEATHER, '{"city":"P","population":' + "9" * 17 + "}")
    assert not takes(WEATHER, '{"city":"P","population":-' + "9" * 17 + "}")
    assert takes(WEATHER, '{"city":"P","area":-' + "9" * 16 + ".0123456789}")
    assert not takes(WEATHER, '{"city":"P","area":' + "9" * 17 + "}")
    assert not takes(WEATHER, '{"city":"P","area":1.' + "3" * 11 + "}")
    assert not takes(WEATHER, '{"city":"P","area":1e400}')
    wide = {"type": "integer", "minimum": 0, "maximum": 10**18}  # the schema's own bound wins
    assert takes(wide, "1" + "0" * 18) and not takes(wide, "-1")
    assert takes({"type": "number", "enum": [3.14159265358979]}, "3.14159265358979")


def test_minimum_maximum_and_the_exclusive_ones_are_enforced():
    dice = {"type": "integer", "minimum": 1, "maximum": 6}
    assert takes(dice, "6") and not takes(dice, "7") and not takes(dice, "0")
    share = {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}
    assert takes(share, "0.5") and not takes(share, "0") and not takes(share, "1")


def test_any_value_is_any_json_with_bounded_numbers():
    any_object = {"type": "object"}
    assert takes(any_object, '{"a":[1,2.5,{"b":null}],"c":"x","d":true}')
    assert not takes(any_object, '{"a":' + "1" * 17 + "}")
    assert not takes({"type": "array"}, "[" + "1" * 17 + "]")
    assert not takes({"type": "object", "properties": {"a": {}}}, '{"a":' + "1" * 17 + "}")
    json_object = ConstraintCompiler().compile_sync("json_object", None).grammar
    matcher = llguidance.LLMatcher(BYTES, json_object)
    assert matcher.validate_tokens(list(b'{"a":' + b"1" * 17)) == 5 + 16


def test_the_server_keeps_its_own_definition_name():
    with pytest.raises(ConstraintError, match="localserve_any_json"):
        check_schema({"$defs": {"localserve_any_json": {}}, "type": "object"})


@pytest.mark.parametrize("bad", [7, "int", [], ["string", 3], {"a": 1}])
def test_a_type_that_is_not_a_json_type_is_refused_naming_it(bad):
    with pytest.raises(ConstraintError, match=r"schema\.properties\.a\.type: one of array"):
        check_schema({"type": "object", "properties": {"a": {"type": bad}}})
