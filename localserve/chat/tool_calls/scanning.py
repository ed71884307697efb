"""Reading a reply's held text for calls: where a JSON object or array ends (resumable as the
text grows), a call object's name and arguments, function names, whitespace.

Tested in tests/unit/chat/test_tool_calls.py.
"""

from __future__ import annotations

import json
import re

MAX_NAME_CHARS = 64  # OpenAI's limit on a function name
SPACE = " \t\r\n"

_MARKS = {  # what matters outside a string, and inside one (by its quote)
    '"': re.compile(r'["\\{}\[\]]'),
    "\"'": re.compile(r"[\"'\\{}\[\]]"),
}
_STRING_MARKS = {'"': re.compile(r'["\\]'), "'": re.compile(r"['\\]")}


def json_value_end(
    text: str, start: int, resume: list | None = None, quotes: str = '"'
) -> int | None:
    """The index just past the JSON object or array opening at `start`; None if it is not closed
    yet. Only brackets and strings are followed: whether the value is valid is json's to say.
    With `quotes="\"'"` it follows a Python literal's brackets the same way.

    `resume` (an empty list at first, kept by the caller while `text` only grows) carries where
    the scan stopped, so a call each delta costs the delta, not the whole text again."""
    state = resume if resume is not None else []
    if not state:
        state.extend((start, 0, ""))
    i, depth, quote = state
    if depth < 0:
        return i  # closed at i by an earlier call
    while True:
        m = (_STRING_MARKS[quote] if quote else _MARKS[quotes]).search(text, i)
        if m is None:
            i = len(text)
            break
        c, i = m.group(), m.end()
        if c == "\\":
            if i == len(text):
                i -= 1  # the escaped character has not come yet: look again from the backslash
                break
            i += 1
        elif c in "\"'":
            quote = "" if quote else c
        elif c in "{[":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                state[:] = (i, -1, "")
                return i
    state[:] = (i, depth, quote)
    return None


def loads(text: str) -> object:
    """json.loads, None for text that is not JSON (or nests past the decoder's depth)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def call_from_json(value: object, args_keys: tuple[str, ...]) -> tuple[str, dict] | None:
    """(name, arguments) of a call object `{"name": ..., <args key>: {...}}`, or None.

    The arguments may also be a JSON string holding an object (some models write them so);
    missing arguments are an empty object; a key outside the call's shape makes it not a call."""
    if not isinstance(value, dict) or not is_name(value.get("name")):
        return None
    if set(value) - {"name", "type", "id", *args_keys} or value.get("type", "function") != (
        "function"
    ):
        return None
    present = [k for k in args_keys if k in value]
    if len(present) > 1:
        return None
    args = value[present[0]] if present else {}
    if isinstance(args, str):
        args = loads(args)
    return (value["name"], args) if isinstance(args, dict) else None


def is_name(name: object) -> bool:
    return isinstance(name, str) and 0 < len(name) <= MAX_NAME_CHARS and name.strip() == name


def skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in SPACE:
        i += 1
    return i
