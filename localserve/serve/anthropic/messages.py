"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: a conversation in, the assistant's
next message (or the prompt's token count) out.

`system` is a string or text blocks; messages are user and assistant turns whose content is a
string or blocks: text, tool_use (an assistant's call: id, name, input) and tool_result (a
user's answer to one: tool_use_id, content, is_error, shown as a tool message, "Error: "
before a failed one's content); a tool_result answers a tool_use of the assistant message
right before it, and tool_use ids are unique (chat/messages.py's rule, as Anthropic's API
checks it: a 400 naming messages.3.content.0.tool_use_id otherwise). An assistant's thinking
blocks sent back are left out (chat templates drop old reasoning). Images, documents and other
block types are refused with a 400 naming them, as is a last message of the assistant's (a
prefill: localserve does not continue a turn). Fields are named as Anthropic names them
(errors.py). `tools` and `tool_choice` (auto, any, tool, none; disable_parallel_tool_use) map onto
serve/tool_use.py as OpenAI's (any = "required", tool = a named function: the call is forced
by a grammar); `thinking` (enabled, adaptive or disabled) is the template's enable_thinking
(its budget_tokens is not held apart: max_tokens bounds the whole reply). count_tokens renders
and tokenizes the prompt exactly as a request would, without generating; at most
MAX_COUNTING run at once (a 429 beyond).

Tested in tests/e2e/test_anthropic_api.py and tests/e2e/test_hostile_clients.py; on a fake
Frontdoor in tests/unit/serve/anthropic/.
"""

from __future__ import annotations

import asyncio

import msgspec
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from localserve.chat.messages import (
    PromptMessage,
    ToolCallMade,
    ToolHistoryError,
    check_tool_history,
)
from localserve.serve.anthropic import errors
from localserve.serve.anthropic.errors import (
    AnthropicError,
    invalid,
    named_as_anthropic,
    retry_after,
    unsupported,
)
from localserve.serve.anthropic.reply import start_reply
from localserve.serve.anthropic.types import Block, CountRequest, MessageParam, MessagesRequest
from localserve.serve.anthropic.validation import (
    check_model,
    identify,
    read_body,
    sampling_fields,
)
from localserve.serve.door import Frontdoor, Refusal
from localserve.serve.prompt import PromptTooLong
from localserve.serve.tool_use import ToolUse, ToolUseError, tool_use

MAX_BLOCKS = 4096  # content blocks in one request, all messages together
MAX_ID_CHARS = 256  # a tool_use block's id
MAX_NAME_CHARS = 64  # a tool's name
MAX_COUNTING = 4  # count_tokens requests rendering at once
ROLES = ("user", "assistant")
THINKING = {"enabled": True, "adaptive": True, "disabled": False}

_encoder = msgspec.json.Encoder()


async def create_message(door: Frontdoor, request: HttpRequest) -> Response:
    user = await identify(door, request)  # before anything else is answered
    body = await read_body(door, request, MessagesRequest)
    door = check_model(door, body.model)
    fields = sampling_fields(door, body)
    messages, use = await prompt_parts(door, body)
    stream = bool(body.stream)
    return await start_reply(door, request, user, body.model, stream, fields, messages, use)


class TokenCounter:
    """`/v1/messages/count_tokens`, a few at a time (rendering is the prompt builder's work)."""

    def __init__(self, door: Frontdoor) -> None:
        self.door = door
        self._slots = asyncio.Semaphore(MAX_COUNTING)

    async def count_tokens(self, request: HttpRequest) -> Response:
        door = self.door
        await identify(door, request)
        body = await read_body(door, request, CountRequest)
        door = check_model(door, body.model)
        messages, use = await prompt_parts(door, body)
        if self._slots.locked():
            raise AnthropicError(429, "too many token counts at once", retry_after(1))
        async with self._slots:
            try:
                prompts = await door.loaded_prompts()  # a model not loaded is loaded first
                prompt = await prompts.chat(messages, None, use.extras)
            except Refusal as e:  # its model could not be loaded
                raise errors.refused(e) from None
            except PromptTooLong as e:
                raise AnthropicError(400, f"prompt is too long: {e}") from None
            except ValueError as e:
                raise AnthropicError(400, str(e)) from None
        body = {"input_tokens": len(prompt.tokens)}
        return Response(_encoder.encode(body), media_type="application/json")


async def prompt_parts(door: Frontdoor, body: CountRequest) -> tuple[list[PromptMessage], ToolUse]:
    """The request's messages as the prompt's, and its tools, checked."""
    count = Count()
    messages: list[PromptMessage] = []
    origins: list[Origin] = []  # where each prompt message comes from
    if body.system is not None:
        messages.append(PromptMessage("system", _text(body.system, "system", count)))
        origins.append((-1, ()))
    if not body.messages:
        raise invalid("messages", "at least one message is needed")
    calls: dict[str, str] = {}  # a tool_use id to its tool's name
    for i, message in enumerate(body.messages):
        for made, blocks in _message(message, f"messages.{i}", calls, count):
            messages.append(made)
            origins.append((i, blocks))
    if body.messages[-1].role != "user":
        raise unsupported("messages", "a last message of the assistant's (a prefill)")
    _check_history(messages, origins)
    return messages, await _tool_use(door, body)


# a prompt message's request message and blocks: a tool message its tool_result block, an
# assistant message its tool_use blocks in order (the system prompt: -1)
Origin = tuple[int, tuple[int, ...]]
_FIELDS = {"tool_call_id": "tool_use_id", "arguments": "input"}  # chat/messages.py's: Anthropic's


def _check_history(messages: list[PromptMessage], origins: list[Origin]) -> None:
    """The tool_use and tool_result blocks as Anthropic checks them (chat/messages.py: a
    tool_result answers a tool_use of the assistant message right before it, ids are unique),
    named as Anthropic names them: messages.3.content.0.tool_use_id."""
    try:
        check_tool_history(messages)
    except ToolHistoryError as e:
        i, blocks = origins[e.index]
        block = blocks[0 if e.call is None else e.call]
        field = _FIELDS.get(e.field, e.field)
        raise invalid(f"messages.{i}.content.{block}.{field}", e.why) from None


class Count:
    """The blocks seen so far, bounded."""

    def __init__(self) -> None:
        self.n = 0

    def add(self, n: int, where: str) -> None:
        self.n += n
        if self.n > MAX_BLOCKS:
            raise invalid(where, f"at most {MAX_BLOCKS} content blocks in a request")


def _message(
    message: MessageParam, where: str, calls: dict, count: Count
) -> list[tuple[PromptMessage, tuple[int, ...]]]:
    """A request message as prompt messages, each with the blocks it comes from (Origin)."""
    role = message.role
    if role not in ROLES:
        raise invalid(f"{where}.role", f"{role[:40]!r} is not one of user, assistant")
    content = message.content
    if isinstance(content, str):
        return [(PromptMessage(role, content), ())]
    count.add(len(content), f"{where}.content")
    texts, made, made_at, out = [], [], [], []
    for j, block in enumerate(content):
        at = f"{where}.content.{j}"
        if block.type == "text":
            texts.append(_required(block.text, f"{at}.text"))
        elif block.type in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # templates drop old reasoning
        elif block.type == "tool_use" and role == "assistant":
            made.append(_call(block, at, calls))
            made_at.append(j)
        elif block.type == "tool_result" and role == "user":
            out.append((_result(block, at, calls, count), (j,)))
        elif block.type in ("tool_use", "tool_result", "thinking", "redacted_thinking"):
            raise invalid(f"{at}.type", f"a {block.type} block in a {role} message")
        else:
            raise unsupported(f"{at}.type", f"a content block of type {block.type[:40]!r}")
    if role == "assistant":
        return [(PromptMessage("assistant", "\n".join(texts), tuple(made)), tuple(made_at))]
    return out + ([(PromptMessage("user", "\n".join(texts)), ())] if texts or not out else [])


def _call(block: Block, at: str, calls: dict) -> ToolCallMade:
    call_id = _required(block.id, f"{at}.id")
    name = _required(block.name, f"{at}.name")
    if not 0 < len(call_id) <= MAX_ID_CHARS or not 0 < len(name) <= MAX_NAME_CHARS:
        raise invalid(at, f"an id of 1-{MAX_ID_CHARS} characters, a name of 1-{MAX_NAME_CHARS}")
    if not isinstance(block.input, dict):
        raise invalid(f"{at}.input", "the call's arguments, an object")
    calls[call_id] = name
    return ToolCallMade(call_id, name, _encoder.encode(block.input).decode())


def _result(block: Block, at: str, calls: dict, count: Count) -> PromptMessage:
    call_id = _required(block.tool_use_id, f"{at}.tool_use_id")
    if len(call_id) > MAX_ID_CHARS:
        raise invalid(f"{at}.tool_use_id", f"at most {MAX_ID_CHARS} characters")
    content = "" if block.content is None else _text(block.content, f"{at}.content", count)
    if block.is_error:
        content = "Error: " + content
    return PromptMessage("tool", content, (), call_id, calls.get(call_id))


def _text(content: str | list[Block], where: str, count: Count) -> str:
    """A string, or text blocks joined (system, a tool_result's content)."""
    if isinstance(content, str):
        return content
    count.add(len(content), where)
    texts = []
    for j, block in enumerate(content):
        if block.type != "text":
            raise unsupported(f"{where}.{j}.type", f"a block of type {block.type[:40]!r} here")
        texts.append(_required(block.text, f"{where}.{j}.text"))
    return "\n".join(texts)


def _required(value: str | None, where: str) -> str:
    if value is None:
        raise invalid(where, "required")
    return value


async def _tool_use(door: Frontdoor, body: CountRequest) -> ToolUse:
    tools = None
    if body.tools is not None:
        tools = [_tool(t, f"tools.{i}") for i, t in enumerate(body.tools)]
    choice, parallel = None, None
    if body.tool_choice is not None:
        choice = _choice(body.tool_choice.type, body.tool_choice.name)
        disable = body.tool_choice.disable_parallel_tool_use  # unset: OpenAI's unset
        parallel = None if disable is None else not disable
    kwargs = None
    if body.thinking is not None:
        if body.thinking.type not in THINKING:
            raise invalid("thinking.type", "enabled, adaptive or disabled")
        kwargs = {"enable_thinking": THINKING[body.thinking.type]}
    try:
        return await tool_use(door, tools, choice, parallel, kwargs)
    except ToolUseError as e:  # checked as OpenAI's fields: named as Anthropic's
        raise AnthropicError(400, named_as_anthropic(str(e))) from None


def _tool(tool, where: str) -> dict:
    if tool.type not in (None, "custom"):
        raise unsupported(f"{where}.type", f"the server tool {tool.type[:40]!r}")
    if tool.input_schema is None:
        raise invalid(f"{where}.input_schema", "required (a JSON schema of the input)")
    function = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _choice(kind: str, name: str | None):
    """Anthropic's tool_choice as OpenAI's."""
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool":
        if not name:
            raise invalid("tool_choice.name", "the tool to call")
        return {"type": "function", "function": {"name": name}}
    raise invalid("tool_choice.type", "auto, any, tool or none")
