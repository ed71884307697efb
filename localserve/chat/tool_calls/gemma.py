"""The `gemma` format (Gemma 3 has no tool tokens): a Python list of calls or a JSON call
object opening the reply, or Python calls in a ```` ```tool_code ```` block anywhere.

Tested in tests/unit/chat/test_tool_calls.py and tests/unit/chat/test_scripted_replies.py.
"""

from __future__ import annotations

import re

from localserve.chat.tool_calls.parser import NEED_MORE, Attempt, Found, ToolCallParser
from localserve.chat.tool_calls.pythonic import pythonic_calls

_CALL_OPENING = re.compile(r"\[\s*(?:[A-Za-z_][\w.]*\s*)?")  # "[" and a function's name


class GemmaParser(ToolCallParser):
    """Gemma 3: Python calls in a ```` ```tool_code ```` block anywhere; or, opening the reply, a
    Python list of calls `[f(a=1), g(b="x")]` or a JSON call object `{"name": ..., "parameters":
    {...}}` (the two forms Google's function-calling guide prompts for)."""

    fence = "```tool_code"
    triggers = (fence,)
    opening_triggers = ("[", "{")
    args_keys = ("parameters", "arguments")

    def attempt(self, text: str, final: bool) -> Attempt:
        if text.startswith("{"):
            got = self._json_call_at(text, 0, self.args_keys)
            return Found(got[0], [got[1]]) if isinstance(got, tuple) else got
        if text.startswith("["):
            opening = _CALL_OPENING.match(text)
            if opening is None:
                return None
            if opening.end() == len(text):
                return NEED_MORE  # "[", "[get_wea", "[get_weather ": a call may still come
            if text[opening.end()] != "(":
                return None  # "[1, 2]", "[a link](...)", "[Note: ...": not calls, not held
            end = self._value_end(text, 0, quotes="\"'")
            if end is None:
                return NEED_MORE
            calls = pythonic_calls(text[:end])
            return Found(end, calls) if calls else None
        return self._block(text)

    def _block(self, text: str) -> Attempt:
        header_end = self._find(text, "\n", len(self.fence))
        if header_end < 0:
            return NEED_MORE if not text[len(self.fence) :].strip(" \t\r") else None
        if text[len(self.fence) : header_end].strip(" \t\r"):
            return None  # ```tool_codefoo: another fence
        close = self._find(text, "```", header_end)
        if close < 0:
            return NEED_MORE
        calls = pythonic_calls(text[header_end:close])
        return Found(close + 3, calls) if calls else None
