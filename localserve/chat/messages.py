"""A chat's messages as the prompt builder takes them, tool calls and results included.

Front-ends (the websocket `chat` frame, the OpenAI API) check what clients send and hand the
prompt builder `PromptMessage`s: a role, its text, and for tool use the calls an assistant
message made (`ToolCallMade`: an id, a function name, its arguments as JSON text) or the call a
`tool` message answers (`tool_call_id`, the function's `name`). `as_template` gives the message
as Hugging Face templates expect it (arguments as an object, which is what they iterate or
re-encode). Plain `(role, content)` pairs are taken too (`as_prompt_message`).

`check_tool_history` is the rule a history of calls keeps, as OpenAI's and Anthropic's APIs
hold it (both refuse the rest with a 400): a `tool` message answers a call of the assistant
message right before it (only other answers between), each call once; call ids are unique in
the chat; a call's arguments are JSON text of an object. A call left unanswered is allowed,
on purpose, where both APIs refuse it: an agent that lost a tool's result can still go on.
Its `ToolHistoryError` says which message, which call and which field; each front door names
them in its own terms.

Tested in tests/unit/chat/test_messages.py and tests/unit/serve/test_prompt.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
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


class ToolHistoryError(ValueError):
    """A history of calls the APIs refuse: `index` is the message's among those checked, `call`
    the call's among its tool_calls (None: the message's own tool_call_id), `field` one of
    "tool_call_id", "id", "arguments"; the message names them as a websocket chat frame does."""

    def __init__(self, index: int, call: int | None, field: str, why: str) -> None:
        self.index, self.call, self.field, self.why = index, call, field, why
        super().__init__(f"{self.path}: {why}")

    @property
    def path(self) -> str:
        """The field, as the websocket chat frame (and OpenAI, but for `function.`) has it."""
        where = f"messages[{self.index}]"
        if self.call is not None:
            where += f".tool_calls[{self.call}]"
        return f"{where}.{self.field}"


def check_tool_history(messages: Sequence[PromptMessage]) -> None:
    """The chat's calls and answers as OpenAI and Anthropic check them; ToolHistoryError at the
    first message that breaks the rule (module docstring)."""
    made: set[str] = set()  # every call's id so far
    answerable: dict[str, bool] | None = None  # the calls right before: id -> answered yet
    for i, message in enumerate(messages):
        if message.role == "tool":
            call_id = message.tool_call_id or ""
            _check_answer(i, call_id, answerable, bool(made))
            answerable[call_id] = True  # not None: _check_answer refused that
            continue
        for j, call in enumerate(message.tool_calls):
            if call.id in made:
                raise ToolHistoryError(i, j, "id", f"{call.id[:64]!r} is an earlier call's id")
            made.add(call.id)
            if not _is_json_object(call.arguments):
                raise ToolHistoryError(i, j, "arguments", "not JSON text of an object")
        answerable = {call.id: False for call in message.tool_calls} or None


def _check_answer(i: int, call_id: str, answerable: dict | None, any_made: bool) -> None:
    if answerable is None:
        why = ("it answers a call only right after the assistant message that made it"
               if any_made else "no call comes before it to answer")  # fmt: skip
        raise ToolHistoryError(i, None, "tool_call_id", why)
    if call_id not in answerable:
        why = f"{call_id[:64]!r} is not a call of the assistant message right before it"
        raise ToolHistoryError(i, None, "tool_call_id", why)
    if answerable[call_id]:
        raise ToolHistoryError(i, None, "tool_call_id", f"{call_id[:64]!r} is answered twice")


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):  # not JSON; nested past the parser's depth
        return False
