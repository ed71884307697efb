"""Schemas as client input: bounded, checked keyword by keyword, compiled off the loop, cached."""

from __future__ import annotations

import asyncio
import time

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
