"""A Responses request's `input` and `instructions`, and the chain of responses it continues, as
the chat's messages (chat/messages.py's `PromptMessage`s).

`input` is a string (one user message) or a list of items:

- messages: `{"role": "user" | "system" | "developer" | "assistant", "content": ...}` (`type`
  "message" or absent), the content a string or text parts (`input_text`, `output_text`);
  images, files and audio are refused naming the part;
- `{"type": "function_call", "call_id", "name", "arguments"}`: a call the assistant made;
- `{"type": "function_call_output", "call_id", "output"}`: its result (a `tool` message);
- `{"type": "reasoning", ...}`: taken and left out of the prompt (templates drop reasoning).

An assistant turn is the run of assistant items between two other items: its calls and the
text beside them, in whatever order they come (this server's own output lists a call before
the text the model wrote after it; OpenAI's SDKs and agents send the items back as they got
them), reasoning items among them. It is one assistant message, its text joined, its calls in
their order, as the chain stores a reply (`output_turns`); a `function_call_output` answers a
call of the turn right before it. Two assistant messages with no call between or beside them
stay two messages.

The chain's turns come first (each stored response's input and output, oldest first: the turns
its prompt and reply were), then the new input; `instructions` (this request's own, as OpenAI:
a previous response's are not carried over) is the system message at the start. So a follow-up
renders, token for token, as the previous prompt followed by its reply and the new turns, and the
engine's prefix cache finds the previous conversation's cells. The whole history of calls is then
checked as chat completions check theirs (check_tool_history), named as `input[3].call_id`.

Tested in tests/unit/serve/responses/test_create.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from localserve.chat.messages import (
    PromptMessage,
    ToolCallMade,
    ToolHistoryError,
    check_tool_history,
)
from localserve.serve.openai.errors import ApiError, unsupported
from localserve.serve.responses.checks import invalid

MAX_ITEMS = 4096  # input items in one request
MAX_ID_CHARS = 256  # a call's call_id, as a client sends it back
MAX_NAME_CHARS = 64
ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text", "text")

_encode = msgspec.json.Encoder().encode
_decode_turns = msgspec.json.Decoder(list[PromptMessage]).decode


def encode_turns(turns: list[PromptMessage]) -> bytes:
    return _encode(turns)


def decode_turns(data: bytes) -> list[PromptMessage]:
    return _decode_turns(data)


def input_items(given: str | list[Any] | None) -> list[dict]:
    """`input` as a list of items (a string is one user message), bounded in count."""
    if given is None:
        raise invalid("input", "the input: a string or a list of items")
    if isinstance(given, str):
        return [{"type": "message", "role": "user", "content": given}]
    if len(given) > MAX_ITEMS:
        raise invalid("input", f"at most {MAX_ITEMS} items")
    return given


class InputTurns(NamedTuple):
    """The input as chat messages, and for each the input item it came from (`items`) and
    the items of its calls (`calls`), to name the item a finding is about."""

    messages: list[PromptMessage]
    items: list[int]
    calls: list[tuple[int, ...]]


def input_turns(items: list[Any]) -> InputTurns:
    """The input items as chat messages (their calls merged into assistant messages)."""
    turns = InputTurns([], [], [])
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise invalid(f"input[{i}]", "must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            _add_message(turns, _message(item, i), i)
        elif kind == "function_call":
            _add_call(turns, _call(item, i), i)
        elif kind == "function_call_output":
            _append(turns, _output(item, i, turns.messages), i)
        elif kind != "reasoning":
            raise unsupported(f"input[{i}].type", f"the input item {str(kind)[:40]!r}")
    return turns


def _append(turns: InputTurns, message: PromptMessage, i: int) -> None:
    turns.messages.append(message)
    turns.items.append(i)
    turns.calls.append(())


def chat_messages(
    instructions: str | None, chain: list[PromptMessage], turns: InputTurns
) -> list[PromptMessage]:
    """The prompt's messages: the instructions, the chain's turns, this input's; the history of
    calls checked (a 400 naming the input item)."""
    head = [PromptMessage("system", instructions)] if instructions else []
    messages = head + chain + turns.messages
    try:
        check_tool_history(messages)
    except ToolHistoryError as e:
        raise _history_error(e, len(head) + len(chain), turns) from None
    return messages


def output_turns(content: str, calls: list[ToolCallMade]) -> list[PromptMessage]:
    """A reply as the turns its chain goes on with: one assistant message, its calls in it."""
    return [PromptMessage("assistant", content, tuple(calls))]


def _message(item: dict, i: int) -> PromptMessage:
    role = ROLES.get(item.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise invalid(f"input[{i}].role", "one of user, system, developer, assistant")
    content = item.get("content", "")
    if isinstance(content, str):
        return PromptMessage(role, content)
    if not isinstance(content, list):
        raise invalid(f"input[{i}].content", "a string or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise unsupported(f"input[{i}].content[{j}]", f"content of type {str(kind)[:40]!r}")
        texts.append(part["text"])
    return PromptMessage(role, "".join(texts))


def _call(item: dict, i: int) -> ToolCallMade:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
    if not isinstance(call_id, str) or not 0 < len(call_id) <= MAX_ID_CHARS:
        raise invalid(f"input[{i}].call_id", f"the call's id: at most {MAX_ID_CHARS} characters")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
        raise invalid(f"input[{i}].name", f"the function's name: at most {MAX_NAME_CHARS}")
    if not isinstance(arguments, str):
        raise invalid(f"input[{i}].arguments", "JSON text of an object")
    return ToolCallMade(call_id, name, arguments)


def _add_message(turns: InputTurns, message: PromptMessage, i: int) -> None:
    """An assistant's text right after its calls joins their turn (module docstring)."""
    messages = turns.messages
    if message.role == "assistant" and messages and messages[-1].role == "assistant" and \
            messages[-1].tool_calls:  # fmt: skip
        last = messages[-1]
        messages[-1] = last._replace(content=last.content + message.content)
    else:
        _append(turns, message, i)


def _add_call(turns: InputTurns, call: ToolCallMade, i: int) -> None:
    """A call joins the assistant message right before it (its text, or its other calls)."""
    messages = turns.messages
    if messages and messages[-1].role == "assistant":
        last = messages[-1]
        messages[-1] = last._replace(tool_calls=(*last.tool_calls, call))
        turns.calls[-1] += (i,)
    else:
        _append(turns, PromptMessage("assistant", "", (call,)), i)
        turns.calls[-1] = (i,)


def _output(item: dict, i: int, turns: list[PromptMessage]) -> PromptMessage:
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str) or not 0 < len(call_id) <= MAX_ID_CHARS:
        raise invalid(f"input[{i}].call_id", "the id of the call it answers")
    if isinstance(output, list):  # text parts
        parts = [p.get("text") for p in output if isinstance(p, dict)]
        if len(parts) != len(output) or not all(isinstance(t, str) for t in parts):
            raise unsupported(f"input[{i}].output", "an output of other than text parts")
        output = "".join(parts)
    if not isinstance(output, str):
        raise invalid(f"input[{i}].output", "a string or text parts")
    name = next((c.name for t in reversed(turns) for c in t.tool_calls if c.id == call_id), None)
    return PromptMessage("tool", output, (), call_id, name)


def _history_error(e: ToolHistoryError, first_input: int, turns: InputTurns) -> ApiError:
    """chat/messages.py's finding, named as the input item (or the chain) it is about."""
    field = "arguments" if e.field == "arguments" else "call_id"
    if e.index < first_input:
        return invalid("previous_response_id", f"its chain's calls: {e.why}")
    k = e.index - first_input
    item = turns.items[k] if e.call is None else turns.calls[k][e.call]
    return invalid(f"input[{item}].{field}", e.why)
