"""Structured output: a client's `response_format` (or a grammar) checked, bounded, compiled.

A JSON schema is client input. Before it reaches the engine it is bounded in size (bytes) and
complexity (nesting depth, enum sizes, pattern lengths, subschemas in all), every keyword is
checked against those the grammar engine (llguidance) really enforces — an unsupported one is
refused naming it, never silently ignored — and the grammar is compiled and validated under
llguidance's parser limits on a worker thread with a time bound: off the event loop and off the
engine thread. Results are cached (LRU) by the schema's canonical text, so a client that sends
the same schema every time pays once.

The public API (for `response_format`, and for tool calling's `tool_choice`):

    compiler = ConstraintCompiler()
    c = await compiler.response_format({"type": "json_schema", "json_schema": {...}})
    c = await compiler.json_schema(schema_dict)        # any JSON schema within the bounds
    c = await compiler.lark(text)                      # llguidance Lark; may embed %json{...}
    c = compiler.compile_sync("lark", text)            # the same, blocking (tests, scripts)

Each returns a `localserve.engine.sampling_params.Constraint` to put in a request's
`SamplingParams.constraint` (admission does it: a `Submission(..., constraint=c)` given to
`Frontdoor.submit`), or raises ConstraintError (a ValueError) whose message names the
offending keyword or limit.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import llguidance

from localserve.engine.sampling_params import Constraint

MAX_SCHEMA_BYTES = 32 * 1024  # canonical JSON text of one schema
MAX_GRAMMAR_BYTES = 32 * 1024  # a Lark grammar's text
MAX_DEPTH = 12  # nested subschemas
MAX_SUBSCHEMAS = 512  # subschemas in all
MAX_ENUM = 256  # values of one enum
MAX_PATTERN_CHARS = 256  # one regex pattern (pattern, patternProperties keys)
COMPILE_TIMEOUT_S = 2.0  # a grammar not compiled within this long is refused
CACHE_SIZE = 256  # compiled constraints kept by canonical text

# llguidance enforces these (benchmarks/grammar_engine_choice.py checks each); annotations are
# allowed and have no effect on the output.
ENFORCED = frozenset(
    [
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "$defs",
        "definitions",
        "pattern",
        "format",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "patternProperties",
        "minProperties",
        "maxProperties",
    ]
)
ANNOTATIONS = frozenset(
    [
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "discriminator",
    ]
)
# llguidance's parser limits, for the server's validation and every request's matcher in the
# engine (localserve.runners.grammar): a grammar past them errors instead of running away.
PARSER_LIMITS = dict(step_lexer_fuel=200_000, step_max_items=50_000, max_lexer_states=50_000)
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties")
# strict JSON, compact: no whitespace runs a model could loop in (also for Lark %json, as
# "x-guidance": localserve.chat.tools)
COMPACT_JSON = {"whitespace_flexible": False}


def parser_limits() -> llguidance.LLParserLimits:
    """PARSER_LIMITS as llguidance takes them (its error texts without grammar internals)."""
    return llguidance.LLParserLimits(**PARSER_LIMITS, verbose_errors=False)


class ConstraintError(ValueError):
    """A response_format or grammar refused; the message names the keyword or the limit."""


def check_schema(schema: Any, where: str = "schema") -> str:
    """Check a JSON schema against the bounds and the enforced keywords; the canonical text of
    the schema as the server enforces it (`meant_schema`)."""
    return canonical(meant_schema(schema, where))


def canonical(schema: Any) -> str:
    """A schema's text with its keys sorted, but for the properties of an object, which keep
    their order (the order the reply writes them in): the same schema, the same text."""
    return json.dumps(_sorted(schema), separators=(",", ":"), ensure_ascii=False)


def _sorted(node: Any, keep_order: bool = False) -> Any:
    if isinstance(node, list):
        return [_sorted(sub) for sub in node]
    if not isinstance(node, dict):
        return node
    keys = node if keep_order else sorted(node)
    return {key: _sorted(node[key], key == "properties" and not keep_order) for key in keys}


def meant_schema(schema: Any, where: str = "schema") -> dict:
    """A client's JSON schema, checked against the bounds and the enforced keywords, as the
    server enforces it: what the caller meant, not only what plain JSON Schema allows.

    - An object schema with `properties` (or `patternProperties`) and no `additionalProperties`
      is closed: only its properties (llama.cpp's converter, vLLM and OpenAI's strict mode do
      the same). `additionalProperties: true`, or a schema for them, is honoured when written.
      The members of an `allOf` of several schemas stay open: each closed would refuse the
      others' keys, and their intersection is what the caller wrote.
    - Integers have at most 16 digits (|n| < 2**53) and numbers at most 16 integral and 10
      fractional digits, without an exponent, unless the schema bounds them itself
      (`minimum`, `maximum`, the exclusive ones, `multipleOf`; a side left open gets the
      default bound) or lists its values (`enum`, `const`): a base model cannot write digits
      until max_tokens.
    - Wherever the schema allows any value (`{}`, `true`, an object without properties, an
      array without items) the values are any JSON with those bounded numbers.
    """
    if not isinstance(schema, dict):
        raise ConstraintError(f"{where}: a JSON schema must be an object")
    if len(canonical(schema).encode()) > MAX_SCHEMA_BYTES:
        raise ConstraintError(f"{where}: over {MAX_SCHEMA_BYTES} bytes")
    count = [0]
    _check_node(schema, where, 0, count)
    for key in ("$defs", "definitions"):
        if ANY_JSON in _mapping(schema, key, where):
            raise ConstraintError(f"{where}.{key}: the name {ANY_JSON!r} is the server's")
    meaning = _Meaning()
    meant = meaning.node(schema)
    if meaning.uses_any:
        meant["$defs"] = {**meant.get("$defs", {}), ANY_JSON: ANY_JSON_SCHEMA}
    return meant


# 16 digits, as llama.cpp's converter allows, and exact: llguidance holds a bound as a double,
# where 10**16 - 1 is 10**16 (a 17-digit integer got through); 2**53 - 1 is also the largest
# integer a JavaScript client reads exactly
MAX_INTEGER = 2**53 - 1
MAX_NUMBER = 10**16  # exclusive: 16 integral digits
NUMBER_STEP = 1e-10  # 10 fractional digits (llguidance's multipleOf takes no finer step)
ANY_JSON = "localserve_any_json"  # the $defs entry of any JSON value with bounded numbers
_ANY_REF = {"$ref": f"#/$defs/{ANY_JSON}"}
_INTEGER_BOUNDS = {"minimum": -MAX_INTEGER, "maximum": MAX_INTEGER}
_NUMBER_BOUNDS = {
    "exclusiveMinimum": -MAX_NUMBER,
    "exclusiveMaximum": MAX_NUMBER,
    "multipleOf": NUMBER_STEP,
}
ANY_JSON_SCHEMA = {
    "anyOf": [
        {"type": "null"},
        {"type": "boolean"},
        {"type": "string"},
        {"type": "number", **_NUMBER_BOUNDS},
        {"type": "array", "items": _ANY_REF},
        {"type": "object", "additionalProperties": _ANY_REF},
    ]
}


class _Meaning:
    """One schema's walk for `meant_schema` (a checked schema: every node a dict or a bool)."""

    def __init__(self) -> None:
        self.uses_any = False

    def node(self, node: Any, in_all_of: bool = False) -> Any:
        if node is False:
            return False
        if node is True or node.keys() <= ANNOTATIONS:  # any value
            self.uses_any = True
            return {**(node if isinstance(node, dict) else {}), **_ANY_REF}
        out = dict(node)
        for key in _SUBSCHEMA_MAPS:
            if key in out:
                out[key] = {name: self.node(sub) for name, sub in out[key].items()}
        for key in _SUBSCHEMA_LISTS:
            if key in out:
                several = key == "allOf" and len(out[key]) > 1
                out[key] = [self.node(sub, several) for sub in out[key]]
        for key in _SUBSCHEMA_ONE:
            if key in out:
                out[key] = self.node(out[key])
        types = out.get("type")
        types = {types} if isinstance(types, str) else set(types or ())
        has_keys = "properties" in out or "patternProperties" in out
        if has_keys and "additionalProperties" not in out and not in_all_of:
            out["additionalProperties"] = False
        if "object" in types and not has_keys and "additionalProperties" not in out:
            out["additionalProperties"] = self.node(True)
        if "array" in types and "items" not in out:
            out["items"] = self.node(True)
        if types & {"integer", "number"} and "enum" not in out and "const" not in out:
            _bound_digits(out, integer="number" not in types)
        return out


def _bound_digits(node: dict, integer: bool) -> None:
    """Default bounds on the sides of a number that the schema leaves open."""
    defaults = _INTEGER_BOUNDS if integer else _NUMBER_BOUNDS
    for side in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if not any(key in node for key in side):
            key = next(k for k in side if k in defaults)
            node[key] = defaults[key]
    if not integer and "multipleOf" not in node:
        node["multipleOf"] = NUMBER_STEP


def _check_node(node: Any, where: str, depth: int, count: list[int]) -> None:
    if isinstance(node, bool):  # true / false are schemas too
        return
    if not isinstance(node, dict):
        raise ConstraintError(f"{where}: a subschema must be an object or a boolean")
    count[0] += 1
    if depth > MAX_DEPTH:
        raise ConstraintError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    if count[0] > MAX_SUBSCHEMAS:
        raise ConstraintError(f"{where}: more than {MAX_SUBSCHEMAS} subschemas")
    for key, value in node.items():
        if key == "x-guidance":  # llguidance's own options (whitespace, ...) are the server's
            raise ConstraintError(f"{where}: the keyword 'x-guidance' is not supported")
        if key not in ENFORCED and key not in ANNOTATIONS and not key.startswith("x-"):
            raise ConstraintError(f"{where}: the keyword {key[:60]!r} is not supported")
        _check_value(key, value, f"{where}.{key}")
    for key in _SUBSCHEMA_MAPS:
        for name, sub in _mapping(node, key, where).items():
            if key == "patternProperties":
                _check_pattern(name, f"{where}.{key}")
            _check_node(sub, f"{where}.{key}.{str(name)[:40]}", depth + 1, count)
    for key in _SUBSCHEMA_LISTS:
        subs = node.get(key, [])
        if not isinstance(subs, list):
            raise ConstraintError(f"{where}.{key}: must be a list of schemas")
        for i, sub in enumerate(subs):
            _check_node(sub, f"{where}.{key}[{i}]", depth + 1, count)
    for key in _SUBSCHEMA_ONE:
        if key in node:
            _check_node(node[key], f"{where}.{key}", depth + 1, count)


def _mapping(node: dict, key: str, where: str) -> dict:
    value = node.get(key, {})
    if not isinstance(value, dict):
        raise ConstraintError(f"{where}.{key}: must be an object")
    return value


JSON_TYPES = frozenset(["null", "boolean", "object", "array", "number", "integer", "string"])


def _check_value(key: str, value: Any, where: str) -> None:
    if key == "type":
        types = value if isinstance(value, list) else [value]
        if not types or not all(isinstance(t, str) and t in JSON_TYPES for t in types):
            raise ConstraintError(f"{where}: one of {', '.join(sorted(JSON_TYPES))}, or a list")
    elif key == "enum":
        if not isinstance(value, list) or not value:
            raise ConstraintError(f"{where}: must be a non-empty list")
        if len(value) > MAX_ENUM:
            raise ConstraintError(f"{where}: more than {MAX_ENUM} values")
    elif key == "pattern":
        _check_pattern(value, where)
    elif key in ("minLength", "maxLength", "minItems", "maxItems") and (
        not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 10_000
    ):
        raise ConstraintError(f"{where}: must be an integer in [0, 10000]")


def _check_pattern(value: Any, where: str) -> None:
    if not isinstance(value, str):
        raise ConstraintError(f"{where}: a pattern must be a string")
    if len(value) > MAX_PATTERN_CHARS:
        raise ConstraintError(f"{where}: a pattern longer than {MAX_PATTERN_CHARS} characters")


def _compile(kind: str, source: str) -> Constraint:
    """The grammar of a checked source, validated under the parser limits (a worker thread)."""
    try:
        if kind == "lark":
            grammar = llguidance.LLMatcher.grammar_from_lark(source)
        else:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(source, COMPACT_JSON)
    except ValueError as e:
        raise ConstraintError(f"the {kind} was refused: {e}") from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        grammar, None, limits=parser_limits()
    )
    if is_error or messages:  # a warning is a keyword it would ignore: refuse rather than lie
        raise ConstraintError(f"the {kind} was refused: {'; '.join(messages)[:300]}")
    return Constraint(kind=kind, grammar=grammar)


class ConstraintCompiler:
    """Compiles constraints on one worker thread, each within COMPILE_TIMEOUT_S, cached."""

    def __init__(self, cache_size: int = CACHE_SIZE, timeout_s: float = COMPILE_TIMEOUT_S):
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="constraints")
        self._cache: OrderedDict[tuple[str, str], Constraint] = OrderedDict()
        self._lock = threading.Lock()
        self._cache_size = cache_size
        self.timeout_s = timeout_s
        self.num_compiled = 0  # cache misses

    async def response_format(self, fmt: Any, where: str = "response_format") -> Constraint | None:
        """OpenAI's `response_format`: None for text, else its constraint."""
        kind, source = parse_response_format(fmt, where)
        if kind is None:
            return None
        try:
            return await self._compile_async(kind, source)
        except ConstraintError as e:  # the compiler's own words: say which field they are about
            raise ConstraintError(f"{where}: {e}") from None

    async def json_schema(self, schema: Any, where: str = "schema") -> Constraint:
        return await self._compile_async("json_schema", check_schema(schema, where))

    async def lark(self, text: str) -> Constraint:
        return await self._compile_async("lark", _check_lark(text))

    def compile_sync(self, kind: str, source: Any) -> Constraint:
        """Blocking: kind "json_schema" (a dict), "json_object" (ignored) or "lark" (text)."""
        kind, text = _checked(kind, source)
        future = self._worker.submit(self._cached, kind, text)
        try:
            return future.result(self.timeout_s)
        except TimeoutError:
            raise ConstraintError(_too_slow(self.timeout_s)) from None

    async def _compile_async(self, kind: str, text: str) -> Constraint:
        with self._lock:
            hit = self._cache.get((kind, text))
        if hit is not None:
            return hit
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(self._worker, self._cached, kind, text), self.timeout_s
            )
        except TimeoutError:
            raise ConstraintError(_too_slow(self.timeout_s)) from None

    def _cached(self, kind: str, text: str) -> Constraint:
        key = (kind, text)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        constraint = _compile("lark" if kind == "lark" else "json_schema", text)
        constraint = Constraint(kind=kind, grammar=constraint.grammar)
        with self._lock:
            self.num_compiled += 1
            self._cache[key] = constraint
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return constraint

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)


# json_object: any JSON object (its numbers bounded as meant_schema bounds them)
JSON_OBJECT_SCHEMA = canonical(meant_schema({"type": "object"}))


def parse_response_format(fmt: Any, where: str = "response_format") -> tuple[str | None, str]:
    """(kind, checked canonical source) of OpenAI's `response_format`; (None, "") for text."""
    if fmt is None:
        return None, ""
    if not isinstance(fmt, dict):
        raise ConstraintError(f"{where}: must be an object")
    kind = fmt.get("type", "text")
    if kind == "text":
        return None, ""
    if kind == "json_object":
        return "json_object", JSON_OBJECT_SCHEMA
    if kind != "json_schema":
        raise ConstraintError(
            f"{where}.type: {str(kind)[:40]!r} is not one of text, json_object, json_schema"
        )
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or "schema" not in spec:
        raise ConstraintError(f"{where}.json_schema: must be an object with a schema")
    name = spec.get("name", "")
    if not isinstance(name, str) or len(name) > 64:
        raise ConstraintError(f"{where}.json_schema.name: a string of at most 64 characters")
    return "json_schema", check_schema(spec["schema"], f"{where}.json_schema.schema")


def _checked(kind: str, source: Any) -> tuple[str, str]:
    if kind == "json_object":
        return kind, JSON_OBJECT_SCHEMA
    if kind == "json_schema":
        return kind, check_schema(source)
    if kind == "lark":
        return kind, _check_lark(source)
    raise ConstraintError(f"constraint kind {kind[:40]!r} is not json_object, json_schema or lark")


def _check_lark(text: Any) -> str:
    if not isinstance(text, str) or not text.strip():
        raise ConstraintError("grammar: must be a non-empty string")
    if len(text.encode()) > MAX_GRAMMAR_BYTES:
        raise ConstraintError(f"grammar: over {MAX_GRAMMAR_BYTES} bytes")
    return text


def _too_slow(timeout_s: float) -> str:
    return f"too complex (not compiled within {timeout_s:g} s)"
