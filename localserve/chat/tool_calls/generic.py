"""The `generic` format, for a model whose chat template shows no call format of its own: the
prompt builder describes the tools in a system message and asks for a call as a JSON object
`{"name": ..., "arguments": {...}}` as the whole reply (serve/prompt.py's GENERIC_TOOLS); the
reply is read for such objects opening it, one or more (whitespace between), bare or in a
```` ```json ```` block, as instruction models often wrap JSON. Anything else is text. This is
what llama.cpp's server does for such templates (its "generic" format: the tools described in a
system message, the reply a JSON object), in the call shape the other JSON formats here read.

Tested in tests/unit/chat/test_tool_calls.py.
"""

from __future__ import annotations

from localserve.chat.tool_calls.parser import NEED_MORE, Attempt, Found, ToolCallParser
from localserve.chat.tool_calls.scanning import skip_space


class GenericParser(ToolCallParser):
    """`{"name": ..., "arguments": {...}}` opening the reply (or a call after a call), bare or
    in a ```` ```json ```` block: any instruction model told so in its system message."""

    fence, fence_end = "```json", "```"
    opening_triggers = ("{", fence)
    args_keys = ("arguments", "parameters")

    def attempt(self, text: str, final: bool) -> Attempt:
        if not text.startswith(self.fence):
            got = self._json_call_at(text, 0, self.args_keys)
            return Found(got[0], [got[1]]) if isinstance(got, tuple) else got
        i = skip_space(text, len(self.fence))
        calls: list[tuple[str, dict]] = []
        while True:
            got = self._json_call_at(text, i, self.args_keys)
            if got is NEED_MORE or (got is None and calls and i == len(text)):
                return NEED_MORE
            if got is None:
                return self._fence_closed(text, i, calls)
            i, call = got
            calls.append(call)
            i = skip_space(text, i)
            if i == len(text):
                return NEED_MORE

    def _fence_closed(self, text: str, i: int, calls: list) -> Attempt:
        """The block's calls once its closing fence comes (else it is text)."""
        if not calls:
            return None
        if text.startswith(self.fence_end, i):
            return Found(i + len(self.fence_end), calls)
        return NEED_MORE if self.fence_end.startswith(text[i:]) else None
