"""The tools a request offers, the choice it leaves the model, and the grammar that forces a call.

A request's `tools` are OpenAI function specs (`{"type": "function", "function": {"name",
"description", "parameters"}}`), client input: `check_tools` bounds them (how many, name
shape, sizes) and gives them back normalized for the chat template. `tool_choice` is "auto"
(the model may call: its reply is read for calls), "none" (no tools shown, none read),
"required" (it must call one) or a named function (it must call that one); `ToolChoice` holds
it. For "required" and a named function the call is forced: `forced_call_grammar` writes an
llguidance Lark grammar in the model's own call format (chat/tool_calls/'s formats) whose
arguments are the tool's JSON schema (`%json`), so the call is well formed and its arguments
valid whatever the weights; chat/constraints.py compiles it under its bounds, with the schema
checks that structured output has (an unsupported keyword in `parameters` is refused naming it).

Tested in tests/unit/chat/test_tools.py.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from localserve.chat.constraints import COMPACT_JSON, meant_schema

MAX_TOOLS = 128
MAX_DESCRIPTION_CHARS = 8192
MAX_TOOLS_BYTES = 256 << 10  # all the specs, as JSON
NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
MAX_PARALLEL_CALLS = 8  # a forced reply holds at most this many calls
ANY_ARGUMENTS = {"type": "object"}  # a function without `parameters` takes any object


class ToolsError(ValueError):
    """Bad `tools` or `tool_choice`; the message names the field."""


def check_tools(tools: Any, where: str = "tools") -> list[dict]:
    """The offered functions, normalized ({"type": "function", "function": {...}})."""
    if not isinstance(tools, list):
        raise ToolsError(f"{where}: must be a list of function specs")
    if len(tools) > MAX_TOOLS:
        raise ToolsError(f"{where}: at most {MAX_TOOLS} tools")
    if len(json.dumps(tools, ensure_ascii=False).encode()) > MAX_TOOLS_BYTES:
        raise ToolsError(f"{where}: over {MAX_TOOLS_BYTES >> 10} KiB of specs")
    out, names = [], set()
    for i, tool in enumerate(tools):
        spec = _function(tool, f"{where}[{i}]")
        if spec["name"] in names:
            raise ToolsError(f"{where}[{i}].function.name: {spec['name']!r} is offered twice")
        names.add(spec["name"])
        out.append({"type": "function", "function": spec})
    return out


def _function(tool: Any, where: str) -> dict:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise ToolsError(f'{where}: only {{"type": "function", "function": {{...}}}} tools')
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise ToolsError(f"{where}.function: must be an object with a name")
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ToolsError(f"{where}.function.name: 1-64 of A-Z a-z 0-9 _ . -")
    spec: dict = {"name": name}
    description = fn.get("description")
    if description is not None:
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS:
            raise ToolsError(f"{where}.function.description: a string of at most 8192 chars")
        spec["description"] = description
    parameters = fn.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise ToolsError(f"{where}.function.parameters: must be a JSON schema (an object)")
        spec["parameters"] = parameters
    return spec


class ToolChoice(NamedTuple):
    mode: str  # auto | none | required | function
    name: str | None = None  # mode "function": the one to call

    @property
    def shows_tools(self) -> bool:
        return self.mode != "none"

    @property
    def is_forced(self) -> bool:
        return self.mode in ("required", "function")


def check_tool_choice(choice: Any, tools: list[dict], where: str = "tool_choice") -> ToolChoice:
    """OpenAI's tool_choice against the offered tools (None: "auto" with tools, else "none")."""
    if choice is None:
        return ToolChoice("auto" if tools else "none")
    if choice in ("auto", "none", "required"):
        if choice != "none" and not tools:
            raise ToolsError(f"{where}: {choice!r} needs tools")
        return ToolChoice(choice)
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise ToolsError(f"{where}.function.name: the function to call")
        if name not in {t["function"]["name"] for t in tools}:
            raise ToolsError(f"{where}.function.name: {name[:64]!r} is not one of the tools")
        return ToolChoice("function", name)
    raise ToolsError(f'{where}: "auto", "none", "required" or {{"type": "function", ...}}')


# --- forcing a call -----------------------------------------------------------------------------


def forced_call_grammar(
    tool_format: str, tools: list[dict], name: str | None = None, parallel: bool = False
) -> str:
    """An llguidance Lark grammar for a reply that is only calls in `tool_format`: exactly one
    (or, with `parallel`, up to MAX_PARALLEL_CALLS) of `name`, or of any offered tool, whose
    arguments are the tool's parameters as the server means them (chat/constraints.py's
    `meant_schema`: closed objects, bounded numbers). Parameters past response_format's bounds
    raise ConstraintError naming them."""
    offered = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    if tool_format in ("hermes", "transcript"):
        sep = _lark("\n" if tool_format == "hermes" else "")
        call = f'"<tool_call>{sep}" %json{_calls(offered, "arguments")} "{sep}</tool_call>"'
        return _repeat(call, '"\\n"', parallel)
    if tool_format in ("llama3", "gemma"):
        return _repeat(f"%json{_calls(offered, 'parameters')}", '"; "', parallel)
    if tool_format == "generic":
        return _repeat(f"%json{_calls(offered, 'arguments')}", '"\\n"', parallel)
    if tool_format == "mistral":
        limit = {"maxItems": MAX_PARALLEL_CALLS if parallel else 1}
        return (
            f'start: "[TOOL_CALLS]" %json{_calls(offered, "arguments", {"minItems": 1, **limit})}'
        )
    raise ToolsError(
        f"tool_choice: a forced call is not supported for the {tool_format!r} tool format "
        '(use "auto")'
    )


def _calls(functions: list[dict], arguments_key: str, array: dict | None = None) -> str:
    """The JSON schema (compact, for Lark's %json) of one call object of any of `functions`,
    or with `array` (its minItems, maxItems) of a list of them. Each function's parameters sit
    in the schema's `$defs`, their own `$ref`s rebased there, so a pydantic model's `$defs`
    resolve inside the call as they did in the tool's schema."""
    defs, options = {}, []
    for i, fn in enumerate(functions):
        key = f"localserve_tool{i}"
        where = f"{fn['name']}.parameters"
        defs[key] = _rebased(meant_schema(fn.get("parameters") or ANY_ARGUMENTS, where), key)
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": fn["name"]}, arguments_key: _ref(key)},
                "required": ["name", arguments_key],
                "additionalProperties": False,
            }
        )
    call = options[0] if len(options) == 1 else {"anyOf": options}
    schema = {"type": "array", "items": call, **array} if array else call
    return _compact({**schema, "$defs": defs})


def _ref(key: str) -> dict:
    return {"$ref": f"#/$defs/{key}"}


def _rebased(node: Any, key: str) -> Any:
    """A schema moved under `$defs/key`: its local `$ref`s ("#/...") point there too."""
    if isinstance(node, list):
        return [_rebased(sub, key) for sub in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for name, value in node.items():
        if name == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[name] = f"#/$defs/{key}{value[1:]}"
        elif name in _DATA:  # values, not schemas: left as written
            out[name] = value
        else:
            out[name] = _rebased(value, key)
    return out


_DATA = frozenset(["enum", "const", "default", "examples"])


def _compact(schema: dict) -> str:
    """`schema` for Lark's %json, without the whitespace runs a model could loop in (llguidance
    lets JSON in a Lark grammar have any whitespace unless told otherwise)."""
    return json.dumps({**schema, "x-guidance": COMPACT_JSON}, ensure_ascii=False)


def _repeat(call: str, sep: str, parallel: bool) -> str:
    more = f" ({sep} call){{0,{MAX_PARALLEL_CALLS - 1}}}" if parallel else ""
    return f"start: call{more}\ncall: {call}"


def _lark(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
