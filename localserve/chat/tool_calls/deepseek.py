"""The `deepseek` format: DeepSeek's `<｜tool▁calls▁begin｜>` … `<｜tool▁calls▁end｜>` tokens around
calls whose arguments are a ```` ```json ```` block (DeepSeek V3, R1 and the R1 distills).

Tested in tests/unit/chat/test_tool_calls.py and tests/unit/chat/test_scripted_replies.py.
"""

from __future__ import annotations

import re

from localserve.chat.tool_calls.parser import NEED_MORE, Attempt, Found, ToolCallParser
from localserve.chat.tool_calls.scanning import is_name, loads, skip_space


class DeepSeekParser(ToolCallParser):
    """`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name\\n```json\\n{...}\\n```
    <｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`: DeepSeek V3, R1 and the R1 distills' templates."""

    calls_begin, calls_end = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    call_begin, call_end = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
    triggers = (calls_begin, call_begin, calls_end)
    preserved_tokens = (calls_begin, calls_end, call_begin, call_end, "<｜tool▁sep｜>")
    _call = re.compile(r"\s*(\w+)<｜tool▁sep｜>([^\n]+)\n```(?:json)?\n(.*)\n```\s*", re.DOTALL)

    def attempt(self, text: str, final: bool) -> Attempt:
        if text.startswith(self.calls_begin):  # the list's wrapper, with its first call
            i = skip_space(text, len(self.calls_begin))
            if not text.startswith(self.call_begin, i):
                return NEED_MORE if self.call_begin.startswith(text[i:]) else None
            return self._call_at(text, i)
        if text.startswith(self.calls_end):  # the wrapper's end, after calls only
            return Found(len(self.calls_end), []) if self._calls else None
        return self._call_at(text, 0)

    def _call_at(self, text: str, i: int) -> Attempt:
        end = self._find(text, self.call_end, i + len(self.call_begin))
        if end < 0:
            return NEED_MORE
        m = self._call.fullmatch(text, i + len(self.call_begin), end)
        if m is None or m.group(1) != "function" or not is_name(m.group(2).strip()):
            return None
        args = loads(m.group(3))
        if not isinstance(args, dict):
            return None
        return Found(end + len(self.call_end), [(m.group(2).strip(), args)])
