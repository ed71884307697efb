"""`POST /api/chat` and `POST /api/generate`: a conversation, or one prompt, in; the reply out.

A chat's messages are system, user, assistant and tool turns; an assistant message may carry
the `tool_calls` it made (Ollama's: no ids, the arguments an object: ids are given here, and a
tool message answers the oldest call not yet answered). `tools` offer functions
(serve/tool_use.py, as the OpenAI API's with tool_choice "auto"); `think` switches the
template's thinking and the reply's reasoning comes back as `message.thinking`; `format` ("json"
or a JSON schema) constrains the reply (admission compiles it). /api/generate takes a `prompt`
(and a `system`), shown through the chat template unless `raw`. Images, a `suffix`, a
`template` of one's own and a `context` are refused with a 400 that names them; an empty
prompt only says the model is loaded (`done_reason` "load"), as Ollama does.

Tested in tests/e2e/test_ollama_api.py; on a fake Frontdoor in tests/unit/serve/ollama/.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from localserve.chat.messages import ROLES, PromptMessage, ToolCallMade
from localserve.serve.door import Frontdoor, Refusal
from localserve.serve.ollama.errors import OllamaError, unsupported
from localserve.serve.ollama.reply import created_at, start_reply
from localserve.serve.ollama.types import ChatRequest, GenerateRequest, OllamaFields, OllamaMessage
from localserve.serve.ollama.validation import (
    check_common,
    identify,
    public_name,
    read_body,
    response_format,
    sampling_fields,
    template_kwargs,
)
from localserve.serve.tool_use import NO_TOOLS, ToolUse, ToolUseError, tool_use

_encoder = msgspec.json.Encoder()
MAX_NAME_CHARS = 64  # a tool's name, as a client sends it back


async def chat(door: Frontdoor, request: HttpRequest) -> Response:
    user = await identify(door, request)  # before anything else is answered
    body = await read_body(door, request, ChatRequest)
    door, keep = check_common(door, body)
    messages = _messages(body.messages)
    if not messages:
        return await _loaded(door, "chat", body.model, keep)
    use = await _tool_use(door, body, body.tools)
    build = lambda p, reply: p.chat(messages, reply, use.extras)  # noqa: E731
    return await _reply(door, request, user, body, "chat", build, use, keep)


async def generate(door: Frontdoor, request: HttpRequest) -> Response:
    user = await identify(door, request)  # before anything else is answered
    body = await read_body(door, request, GenerateRequest)
    door, keep = check_common(door, body)
    for name in ("images", "suffix", "template", "context"):
        if getattr(body, name):
            raise unsupported(name, f"/api/generate's {name}")
    if not body.prompt:
        return await _loaded(door, "generate", body.model, keep)
    prompt = body.prompt
    if body.raw:
        if body.think or body.system:
            raise OllamaError(400, "raw: a raw prompt takes no system and no think")
        build = lambda p, _: p.text(prompt)  # noqa: E731
        return await _reply(door, request, user, body, "generate", build, NO_TOOLS, keep)
    messages = [PromptMessage("user", prompt)]
    if body.system:
        messages.insert(0, PromptMessage("system", body.system))
    use = await _tool_use(door, body, None)
    build = lambda p, reply: p.chat(messages, reply, use.extras)  # noqa: E731
    return await _reply(door, request, user, body, "generate", build, use, keep)


async def _tool_use(door: Frontdoor, body: OllamaFields, tools) -> ToolUse:
    fmt = response_format(body.format)
    try:
        return await tool_use(door, tools, None, None, template_kwargs(body.think), fmt is not None)
    except ToolUseError as e:
        raise OllamaError(400, str(e)) from None


async def _reply(
    door, request, user: str, body: OllamaFields, kind: str, prompt, use: ToolUse, keep
) -> Response:
    config = door.config
    fields = sampling_fields(
        body.options, min(config.default_max_tokens, config.max_tokens), config.max_tokens
    )
    stream = body.stream is not False
    fmt = response_format(body.format)
    return await start_reply(
        door, request, user, kind, stream, fields, prompt, fmt, use, body.model, keep
    )


async def _loaded(door: Frontdoor, kind: str, model: str | None, keep) -> Response:
    """Ollama's answer to a request with nothing to say: the model is loaded (now, if it was
    not: Ollama clients send one to warm a model up), or with keep_alive 0 unloaded."""
    try:
        await door.warm(keep)
    except Refusal as e:
        raise OllamaError(503, e.message) from None
    body = {"model": model or public_name(door), "created_at": created_at()}
    if kind == "chat":
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    body |= {"done": True, "done_reason": "unload" if keep == 0 else "load"}
    return Response(_encoder.encode(body), media_type="application/json")


def _messages(messages: list[OllamaMessage]) -> list[PromptMessage]:
    """Ollama's messages as the prompt's: calls given ids, a tool message answering the
    oldest call not yet answered."""
    out: list[PromptMessage] = []
    unanswered: list[ToolCallMade] = []
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise OllamaError(400, f"messages[{i}].role: {m.role[:40]!r} is not one of "
                              f"{', '.join(ROLES)}")  # fmt: skip
        if m.images:
            raise unsupported(f"messages[{i}].images", "images")
        content = m.content or ""
        if m.tool_calls:
            if m.role != "assistant":
                raise OllamaError(400, f"messages[{i}].tool_calls: only an assistant makes calls")
            calls = tuple(_call(c, f"call_{i}_{j}", f"messages[{i}].tool_calls[{j}]")
                          for j, c in enumerate(m.tool_calls))  # fmt: skip
            unanswered.extend(calls)
            out.append(PromptMessage("assistant", content, calls))
        elif m.role == "tool":
            answered = unanswered.pop(0) if unanswered else None
            name = m.tool_name or (answered.name if answered else None)
            if name is not None and len(name) > MAX_NAME_CHARS:
                raise OllamaError(400, f"messages[{i}].tool_name: at most 64 characters")
            call_id = answered.id if answered else f"call_{i}"
            out.append(PromptMessage("tool", content, (), call_id, name))
        else:
            out.append(PromptMessage(m.role, content))
    return out


def _call(call, call_id: str, where: str) -> ToolCallMade:
    name = call.function.name
    if not name or len(name) > MAX_NAME_CHARS:
        raise OllamaError(400, f"{where}.function.name: 1-{MAX_NAME_CHARS} characters")
    arguments = call.function.arguments
    text = arguments if isinstance(arguments, str) else _encoder.encode(arguments).decode()
    return ToolCallMade(call_id, name, text)
