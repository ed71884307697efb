"""The `mistral` format: `[TOOL_CALLS][{...}, ...]`, `[TOOL_CALLS]name[ARGS]{...}` and
`[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}` (Mistral, Nemo, Small, Magistral, Devstral), with the
9-character call ids Mistral's templates demand.

Tested in tests/unit/chat/test_tool_calls.py and tests/unit/chat/test_scripted_replies.py.
"""

from __future__ import annotations

import re

from localserve.chat.tool_calls.parser import (
    NEED_MORE,
    Attempt,
    Found,
    ToolCallParser,
    random_alnum,
)
from localserve.chat.tool_calls.scanning import MAX_NAME_CHARS, call_from_json, loads, skip_space


def new_mistral_call_id() -> str:
    """A call id Mistral's templates accept: 9 random letters and digits."""
    return random_alnum(9)


class MistralParser(ToolCallParser):
    """`[TOOL_CALLS][{...}, ...]` and `[TOOL_CALLS]name[ARGS]{...}`: Mistral, Nemo, Small,
    Magistral, Devstral. Call ids are 9 letters and digits, as Mistral's templates demand (an
    id the model wrote after `[CALL_ID]` is read past, not kept)."""

    tag, args_tag, id_tag = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
    triggers = (tag,)
    preserved_tokens = (tag, args_tag, id_tag)
    new_id = staticmethod(new_mistral_call_id)
    _name = re.compile(r"[A-Za-z0-9_.\-]+")
    _call_id = re.compile(r"[A-Za-z0-9]*")

    def attempt(self, text: str, final: bool) -> Attempt:
        i = skip_space(text, len(self.tag))
        if i == len(text):
            return NEED_MORE
        if text[i] == "[":
            return self._list_form(text, i)
        name = self._name.match(text, i)
        if name is None or len(name.group()) > MAX_NAME_CHARS:
            return None
        j = name.end()
        if text.startswith(self.id_tag, j):
            j = self._call_id.match(text, j + len(self.id_tag)).end()
        if not text.startswith(self.args_tag, j):
            rest = text[j:]
            return (
                NEED_MORE
                if self.args_tag.startswith(rest) or self.id_tag.startswith(rest)
                else None
            )
        k = j + len(self.args_tag)
        if k == len(text):
            return NEED_MORE
        if text[k] != "{":
            return None
        end = self._value_end(text, k)
        if end is None:
            return NEED_MORE
        args = loads(text[k:end])
        return Found(end, [(name.group(), args)]) if isinstance(args, dict) else None

    def _list_form(self, text: str, i: int) -> Attempt:
        end = self._value_end(text, i)
        if end is None:
            return NEED_MORE
        value = loads(text[i:end])
        if not isinstance(value, list) or not value:
            return None
        calls = [call_from_json(v, ("arguments",)) for v in value]
        return None if None in calls else Found(end, calls)
