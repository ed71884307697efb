"""Python call syntax read as tool calls (`f(a=1)` lines, or a list of calls): parsed with `ast`,
literal keyword values only, never run.

Tested in tests/unit/chat/test_tool_calls.py and tests/unit/chat/test_scripted_replies.py.
"""

from __future__ import annotations

import ast
import json

from localserve.chat.tool_calls.scanning import is_name


def pythonic_calls(code: str) -> list[tuple[str, dict]] | None:
    """The calls in Python call syntax — `f(a=1)` lines, or a list `[f(a=1), g(b="x")]` — as
    (name, arguments); None unless every statement is such a call with literal keyword values.
    The code is parsed, never run."""
    try:
        tree = ast.parse(code.strip(), mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    nodes: list[ast.expr] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            return None
        value = stmt.value
        nodes.extend(value.elts if isinstance(value, ast.List | ast.Tuple) else [value])
    calls = [_pythonic_call(node) for node in nodes]
    return None if not calls or None in calls else calls


def _pythonic_call(node: ast.expr) -> tuple[str, dict] | None:
    if not isinstance(node, ast.Call) or node.args:
        return None
    name = _dotted_name(node.func)
    if name is None or not is_name(name):
        return None
    args = {}
    for kw in node.keywords:
        if kw.arg is None:
            return None  # **kwargs
        try:
            value = ast.literal_eval(kw.value)
            json.dumps(value, allow_nan=False)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return None
        args[kw.arg] = _jsonable(value)
    return name, args


def _dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted_name(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _jsonable(value: object) -> object:
    """A literal json.dumps accepted, as JSON reads it back: tuples as lists, keys as strings."""
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value
