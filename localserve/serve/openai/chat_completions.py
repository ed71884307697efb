"""`POST /v1/chat/completions`: a conversation in, the assistant's next message out.

Messages are system, user and assistant turns (developer counts as system); their content is a
string or text parts. `response_format` (json_object, json_schema) constrains the reply to
JSON (localserve.chat.constraints). Tool calling, log probabilities, audio and predicted output
are refused with a 400 that names the field.

Tested in tests/e2e/test_openai_api.py.
"""

from __future__ import annotations

from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from localserve.serve.admission import Frontdoor
from localserve.serve.openai.errors import ApiError, unsupported
from localserve.serve.openai.reply import start_reply
from localserve.serve.openai.types import ChatCompletionRequest, ChatMessage
from localserve.serve.openai.validation import read_body, refuse_unsupported
from localserve.serve.prompt import ROLES


async def create_chat_completion(door: Frontdoor, request: HttpRequest) -> Response:
    body = await read_body(door, request, ChatCompletionRequest)
    _refuse_unsupported(body)
    messages = [(_role(m, i), _content(m, i)) for i, m in enumerate(body.messages)]
    max_tokens = body.max_completion_tokens
    if max_tokens is None:
        max_tokens = body.max_tokens
    return await start_reply(
        door,
        request,
        body,
        "chat",
        max_tokens,
        lambda prompts, reply: prompts.chat(messages, reply),
        body.response_format,  # admission compiles it (localserve.chat.constraints)
    )


def _refuse_unsupported(body: ChatCompletionRequest) -> None:
    refuse_unsupported(body)
    if body.logprobs or body.top_logprobs:
        raise unsupported("logprobs" if body.logprobs else "top_logprobs", "log probabilities")
    for param in ("tools", "functions"):
        if getattr(body, param):
            raise unsupported(param, "tool calling")
    for param in ("tool_choice", "function_call"):
        if getattr(body, param) not in (None, "none"):
            raise unsupported(param, "tool calling")
    if body.audio is not None or (body.modalities not in (None, ["text"])):
        raise unsupported("modalities" if body.audio is None else "audio", "audio output")
    if body.prediction is not None:
        raise unsupported("prediction", "predicted output")


def _role(message: ChatMessage, i: int) -> str:
    if message.tool_calls or message.tool_call_id is not None or message.role == "tool":
        raise unsupported(f"messages[{i}]", "a tool message")
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
