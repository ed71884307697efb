"""What a Responses request is checked for before admission, beside its input items: the fields
localserve does not do, its tools and tool_choice in the chat's terms, `text.format` compiled,
its sampling fields.

Built-in tools (web search, file search, computer use, code interpreter, MCP, ...), background
mode, `conversation`, prompt templates, `include`, log probabilities and `max_tool_calls` get a
400 that names them. Function tools (`{"type": "function", "name", "parameters", ...}`, flat as
the Responses API has them) and `tool_choice` (auto, none, required, `{"type": "function",
"name"}`) become the chat completions' and go through the same checks (serve/tool_use.py:
chat/tools.py's bounds, a forced call's grammar); `text.format` (json_schema, json_object)
through the same constraint compiler as `response_format` (door.constraints).

Tested in tests/unit/serve/responses/test_create.py.
"""

from __future__ import annotations

from typing import Any

from localserve.chat.constraints import ConstraintError
from localserve.engine.sampling_params import Constraint
from localserve.protocol.frames import SamplingFields
from localserve.serve.door import Frontdoor
from localserve.serve.openai.errors import ApiError, unsupported
from localserve.serve.responses.types import ResponsesRequest
from localserve.serve.tool_use import ToolUse, ToolUseError, tool_use

MAX_METADATA_KEYS = 16  # OpenAI's bounds of metadata
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_INSTRUCTIONS_CHARS = 1 << 20  # beside the body's own bound (max_frame_bytes)
TEXT_FORMATS = ("text", "json_object", "json_schema")


def invalid(param: str, why: str) -> ApiError:
    return ApiError(400, f"{param}: {why}", "invalid_value", param)


def refuse_unsupported(body: ResponsesRequest) -> None:
    """The fields OpenAI takes that localserve does not do, named."""
    if body.background:
        raise unsupported("background", "background mode (the reply comes while you wait)")
    if body.conversation is not None:
        raise unsupported("conversation", "a conversation object (use previous_response_id)")
    if body.prompt is not None:
        raise unsupported("prompt", "a stored prompt template")
    if body.include:
        raise unsupported("include", f"including {str(body.include[0])[:60]!r}")
    if body.top_logprobs:
        raise unsupported("top_logprobs", "log probabilities")
    if body.max_tool_calls is not None:
        raise unsupported("max_tool_calls", "a bound on built-in tool calls")
    if body.truncation not in (None, "disabled", "auto"):
        raise invalid("truncation", "one of disabled, auto")
    if body.service_tier not in (None, "auto", "default"):
        raise unsupported("service_tier", f"the service tier {body.service_tier[:40]!r}")
    if body.instructions is not None and len(body.instructions) > MAX_INSTRUCTIONS_CHARS:
        raise invalid("instructions", f"at most {MAX_INSTRUCTIONS_CHARS} characters")
    _check_metadata(body.metadata)
    _check_reasoning(body.reasoning)


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_KEYS:
        raise invalid("metadata", f"at most {MAX_METADATA_KEYS} keys")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS or len(value) > MAX_METADATA_VALUE_CHARS:
            raise invalid(
                "metadata",
                f"keys of at most {MAX_METADATA_KEY_CHARS} characters, values of "
                f"{MAX_METADATA_VALUE_CHARS}",
            )


def _check_reasoning(reasoning: dict | None) -> None:
    """`reasoning` is taken as OpenAI's shape; a thinking model thinks as its template says."""
    if reasoning is None:
        return
    for key in reasoning:
        if key not in ("effort", "summary", "generate_summary"):
            raise unsupported(f"reasoning.{str(key)[:40]}", "this reasoning option")


# --- tools -----------------------------------------------------------------------------------


def chat_tools(tools: list[Any] | None) -> list[dict] | None:
    """The Responses API's flat function tools as chat completions' specs; built-in tools
    refused naming their type."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools[:1000]):  # check_tools bounds the count (128)
        if not isinstance(tool, dict):
            raise invalid(f"tools[{i}]", "must be an object")
        kind = tool.get("type")
        if kind != "function":
            raise unsupported(f"tools[{i}].type", f"the tool type {str(kind)[:40]!r} "
                              "(only function tools)")  # fmt: skip
        extra = set(tool) - {"type", "name", "description", "parameters", "strict"}
        if extra:
            raise unsupported(f"tools[{i}].{sorted(extra)[0][:40]}", "this tool field")
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": function})
    return out + tools[1000:]


def chat_tool_choice(choice: Any) -> Any:
    """The Responses API's tool_choice in chat completions' terms."""
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        if set(choice) - {"type", "name"}:
            raise invalid("tool_choice", 'a named function is {"type": "function", "name": ...}')
        return {"type": "function", "function": {"name": choice.get("name")}}
    kind = choice.get("type") if isinstance(choice, dict) else None
    raise unsupported("tool_choice", f"the tool_choice {str(kind)[:40]!r}")


async def tools_of(door: Frontdoor, body: ResponsesRequest, has_format: bool) -> ToolUse:
    """The request's tools, checked and, for a forced call, its grammar compiled."""
    try:
        return await tool_use(
            door,
            chat_tools(body.tools),
            chat_tool_choice(body.tool_choice),
            body.parallel_tool_calls,
            None,
            has_format,
        )
    except ToolUseError as e:
        # chat/tools.py names chat completions' paths (tools[0].function.name)
        param = e.param.replace(".function.", ".")
        message = str(e).replace(".function.", ".").replace("response_format", "text.format")
        raise ApiError(400, message, "invalid_value", param) from None


# --- text.format --------------------------------------------------------------------------------


def text_format(body: ResponsesRequest) -> dict | None:
    """`text.format` as given; None for plain text."""
    text = body.text
    if text is None:
        return None
    if set(text) - {"format", "verbosity"}:
        raise unsupported(f"text.{sorted(set(text) - {'format', 'verbosity'})[0][:40]}",
                          "this text option")  # fmt: skip
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in TEXT_FORMATS:
        kind = fmt.get("type") if isinstance(fmt, dict) else fmt
        raise invalid("text.format.type", f"{str(kind)[:40]!r} is not one of "
                      f"{', '.join(TEXT_FORMATS)}")  # fmt: skip
    return None if fmt["type"] == "text" else fmt


async def format_constraint(door: Frontdoor, fmt: dict | None) -> Constraint | None:
    """`text.format` compiled as chat completions' response_format is (bounded, cached)."""
    if fmt is None:
        return None
    try:
        if fmt["type"] == "json_object":
            return await door.constraints.response_format({"type": "json_object"}, "text.format")
        name = fmt.get("name", "")
        if not isinstance(name, str) or len(name) > 64:
            raise invalid("text.format.name", "a string of at most 64 characters")
        if "schema" not in fmt:
            raise invalid("text.format.schema", "a json_schema format has a schema")
        return await door.constraints.json_schema(fmt["schema"], "text.format.schema")
    except ConstraintError as e:
        head = str(e).partition(":")[0]
        raise ApiError(400, str(e), "invalid_value", head if " " not in head else None) from None


# --- sampling ---------------------------------------------------------------------------------


def sampling_fields(body: ResponsesRequest, default_max_tokens: int) -> SamplingFields:
    """The one sampling definition: fields not given keep the defaults."""
    given = {
        "max_tokens": default_max_tokens
        if body.max_output_tokens is None
        else body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "seed": body.seed,
    }
    return SamplingFields(**{k: v for k, v in given.items() if v is not None})
