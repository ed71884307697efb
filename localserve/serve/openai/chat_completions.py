"""`POST /v1/chat/completions`: a conversation in, the assistant's next message out.

Messages are system, user, assistant and tool turns (developer counts as system); their content
is a string or text parts; an assistant message may carry the `tool_calls` it made, a tool
message the `tool_call_id` it answers: one of the calls of the assistant message right before
it, as OpenAI checks (chat/messages.py's rule; a 400 naming messages[3].tool_call_id
otherwise). `tools`, `tool_choice` (auto, none, required, a named function) and
`parallel_tool_calls` offer functions (serve/tool_use.py: a forced call is constrained to the
tool's schema); `chat_template_kwargs` reach a Jinja template
(enable_thinking). The reply's calls come back as `message.tool_calls` (streamed as
`delta.tool_calls` by index) with finish_reason "tool_calls", its reasoning as
`reasoning_content`. `response_format` (json_object, json_schema) constrains the reply to JSON
(localserve.chat.constraints). Log probabilities, audio, predicted output and the legacy
`functions` are refused with a 400 that names the field.

Tested in tests/e2e/test_openai_api.py and tests/e2e/test_tool_calling.py; on a fake Frontdoor
in tests/unit/serve/openai/.
"""

from __future__ import annotations

from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from localserve.chat.messages import (
    ROLES,
    PromptMessage,
    ToolCallMade,
    ToolHistoryError,
    check_tool_history,
)
from localserve.serve.door import Frontdoor
from localserve.serve.openai.errors import ApiError, unsupported
from localserve.serve.openai.reply import start_reply
from localserve.serve.openai.types import ChatCompletionRequest, ChatMessage
from localserve.serve.openai.validation import read_body, refuse_unsupported
from localserve.serve.tool_use import ToolUseError, tool_use

MAX_ID_CHARS = 256  # a tool call's id, as a client sends it back


async def create_chat_completion(door: Frontdoor, request: HttpRequest) -> Response:
    body = await read_body(door, request, ChatCompletionRequest)
    door = door.model(body.model)  # checked by read_body: one of the server's
    _refuse_unsupported(body)
    messages = [_message(m, i) for i, m in enumerate(body.messages)]
    _check_history(messages)
    try:
        use = await tool_use(
            door,
            body.tools,
            body.tool_choice,
            body.parallel_tool_calls,
            body.chat_template_kwargs,
            body.response_format is not None,
        )
    except ToolUseError as e:
        raise ApiError(400, str(e), "invalid_value", e.param) from None
    max_tokens = body.max_completion_tokens
    if max_tokens is None:
        max_tokens = body.max_tokens
    return await start_reply(
        door,
        request,
        body,
        "chat",
        max_tokens,
        lambda prompts, reply: prompts.chat(messages, reply, use.extras),
        body.response_format,  # admission compiles it (localserve.chat.constraints)
        use,
    )


def _refuse_unsupported(body: ChatCompletionRequest) -> None:
    refuse_unsupported(body)
    if body.logprobs or body.top_logprobs:
        raise unsupported("logprobs" if body.logprobs else "top_logprobs", "log probabilities")
    if body.functions:
        raise unsupported("functions", "the legacy functions field (send tools)")
    if body.function_call not in (None, "none"):
        raise unsupported("function_call", "the legacy function_call field (send tool_choice)")
    if body.audio is not None or (body.modalities not in (None, ["text"])):
        raise unsupported("modalities" if body.audio is None else "audio", "audio output")
    if body.prediction is not None:
        raise unsupported("prediction", "predicted output")


def _message(message: ChatMessage, i: int) -> PromptMessage:
    role = _role(message, i)
    calls = ()
    if message.tool_calls:
        if role != "assistant":
            raise _invalid(f"messages[{i}].tool_calls", "only an assistant message makes calls")
        calls = tuple(_call(c, f"messages[{i}].tool_calls[{j}]")
                      for j, c in enumerate(message.tool_calls))  # fmt: skip
    call_id = message.tool_call_id
    if role == "tool" and not call_id:
        raise _invalid(f"messages[{i}].tool_call_id", "a tool message answers a call: its id")
    if call_id is not None and len(call_id) > MAX_ID_CHARS:
        raise _invalid(f"messages[{i}].tool_call_id", f"at most {MAX_ID_CHARS} characters")
    name = message.name if role == "tool" else None
    return PromptMessage(
        role, _content(message, i), calls, call_id if role == "tool" else None, name
    )


def _check_history(messages: list[PromptMessage]) -> None:
    """The calls and their answers as OpenAI checks them (chat/messages.py), named as OpenAI
    names them: messages[3].tool_call_id, messages[1].tool_calls[0].function.arguments."""
    try:
        check_tool_history(messages)
    except ToolHistoryError as e:
        is_arguments = e.field == "arguments"
        param = (
            e.path.removesuffix(".arguments") + ".function.arguments" if is_arguments else e.path
        )
        raise _invalid(param, e.why) from None


def _call(call, where: str) -> ToolCallMade:
    if call.type != "function":
        raise _invalid(f"{where}.type", "only function calls")
    if len(call.id) > MAX_ID_CHARS or len(call.function.name) > 64:
        raise _invalid(where, f"an id of at most {MAX_ID_CHARS} characters, a name of 64")
    return ToolCallMade(call.id, call.function.name, call.function.arguments)


def _invalid(param: str, why: str) -> ApiError:
    return ApiError(400, f"{param}: {why}", "invalid_value", param)


def _role(message: ChatMessage, i: int) -> str:
    role = "system" if message.role == "developer" else message.role
    if role not in ROLES:
        raise ApiError(
            400,
            f"messages[{i}].role: {message.role[:40]!r} is not one of "
            f"{', '.join(ROLES)} (or developer)",
            "invalid_value",
            f"messages[{i}].role",
        )
    return role


def _content(message: ChatMessage, i: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise unsupported(f"messages[{i}].content[{j}]", f"content of type {part.type[:40]!r}")
        texts.append(part.text)
    return "".join(texts)
