"""A chat's messages as the prompt builder takes them, tool calls and results included.

Front-ends (the websocket `chat` frame, the OpenAI API) check what clients send and hand the
prompt builder `PromptMessage`s: a role, its text, and for tool use the calls an assistant
message made (`ToolCallMade`: an id, a function name, its arguments as JSON text) or the call a
`tool` message answers (`tool_call_id`, the function's `name`). `as_template` gives the message
as Hugging Face templates expect it (arguments as an object, which is what they iterate or
re-encode). Plain `(role, content)` pairs are taken too (`as_prompt_message`).

Tested in tests/unit/serve/test_prompt.py.
"""

from __future__ import annotations

import json
from typing import NamedTuple

ROLES = ("system", "user", "assistant", "tool")


class ToolCallMade(NamedTuple):
    """A call an assistant message made, as the history carries it."""

    id: str
    name: str
    arguments: str  # JSON text, as OpenAI's API carries it

    def as_template(self) -> dict:
        try:
            arguments = json.loads(self.arguments)
        except ValueError:
            arguments = self.arguments  # not JSON: the template gets the text
        function = {"name": self.name, "arguments": arguments}
        return {"id": self.id, "type": "function", "function": function}


class PromptMessage(NamedTuple):
    role: str  # system | user | assistant | tool
    content: str
    tool_calls: tuple[ToolCallMade, ...] = ()  # an assistant message's calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None  # a tool message: the function that answered

    def as_template(self) -> dict:
        out: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [call.as_template() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


def as_prompt_message(message: PromptMessage | tuple) -> PromptMessage:
    return message if isinstance(message, PromptMessage) else PromptMessage(*message)
