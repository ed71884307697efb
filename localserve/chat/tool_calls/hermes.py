"""The `hermes` format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, several in
a row for parallel calls (Hermes 2 Pro / 3, Qwen 2.5, QwQ, Qwen 3).

Tested in tests/unit/chat/test_tool_calls.py and tests/unit/chat/test_scripted_replies.py.
"""

from __future__ import annotations

from localserve.chat.tool_calls.parser import NEED_MORE, Attempt, Found, ToolCallParser
from localserve.chat.tool_calls.scanning import call_from_json, loads


class HermesParser(ToolCallParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`: Hermes, Qwen 2.5, QwQ, Qwen 3.

    A last call whose closing tag never came is still a call if its JSON is whole and nothing
    but whitespace follows it (models sometimes stop right after the object)."""

    open_tag, close_tag = "<tool_call>", "</tool_call>"
    triggers = (open_tag,)
    preserved_tokens = (open_tag, close_tag)
    args_keys = ("arguments", "parameters")

    def attempt(self, text: str, final: bool) -> Attempt:
        start = len(self.open_tag)
        end = self._find(text, self.close_tag, start)
        if end < 0 and not final:
            return NEED_MORE
        call = call_from_json(loads(text[start : end if end >= 0 else len(text)]), self.args_keys)
        if call is None:
            return None
        return Found(end + len(self.close_tag) if end >= 0 else len(text), [call])
