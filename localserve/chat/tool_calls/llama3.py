"""The `llama3` format: `{"name": ..., "parameters": {...}}` opening the reply or after
`<|python_tag|>`, several separated by `;` (Llama 3.1, 3.2, 3.3).

Tested in tests/unit/chat/test_tool_calls.py and tests/unit/chat/test_scripted_replies.py.
"""

from __future__ import annotations

from localserve.chat.tool_calls.parser import NEED_MORE, Attempt, Found, ToolCallParser
from localserve.chat.tool_calls.scanning import skip_space


class Llama3Parser(ToolCallParser):
    """`{"name": ..., "parameters": {...}}` opening the reply or after `<|python_tag|>`; several
    separated by `;`: Llama 3.1, 3.2, 3.3."""

    python_tag = "<|python_tag|>"
    triggers = (python_tag,)
    opening_triggers = ("{",)
    preserved_tokens = (python_tag,)
    args_keys = ("parameters", "arguments")

    def attempt(self, text: str, final: bool) -> Attempt:
        i = skip_space(text, len(self.python_tag)) if text.startswith(self.python_tag) else 0
        calls: list[tuple[str, dict]] = []
        end = i
        while True:
            got = self._json_call_at(text, i, self.args_keys)
            if got is NEED_MORE and calls and final:
                return Found(i, calls)  # a trailing `;` ends the list
            if not isinstance(got, tuple):
                return got if not calls or got is NEED_MORE else Found(end, calls)
            end, call = got
            calls.append(call)
            j = skip_space(text, end)
            if j == len(text) and not final:
                return NEED_MORE  # a `;` and another call may follow
            if j == len(text) or text[j] != ";":
                return Found(end, calls)
            i = skip_space(text, j + 1)
