"""The Anthropic Messages API's request bodies, as msgspec decodes them.

Fields are None when not given; unknown fields are ignored (clients send many: `metadata`,
`service_tier`, `cache_control` on blocks ...), but a known field of the wrong type is a 400
that names it. A content block is one struct with every block type's fields (`type` says
which are read): an unknown or unsupported type (image, document, ...) is then refused naming
it, which a tagged union would only call "invalid".

Tested in tests/e2e/test_anthropic_api.py; on a fake Frontdoor in tests/unit/serve/anthropic/.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Block(msgspec.Struct, kw_only=True):
    """A content block: text, tool_use (id, name, input), tool_result (tool_use_id, content,
    is_error), thinking / redacted_thinking (an assistant's, sent back), or one refused."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: str | list[Block] | None = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None


class MessageParam(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[Block]


class Tool(msgspec.Struct, kw_only=True):
    """A client tool (`type` absent or "custom"); Anthropic's server tools are refused."""

    name: str
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    type: str | None = None


class ToolChoiceParam(msgspec.Struct, kw_only=True):
    type: str  # auto | any | tool | none
    name: str | None = None  # type "tool": the one to call
    disable_parallel_tool_use: bool | None = None


class Thinking(msgspec.Struct, kw_only=True):
    type: str  # enabled | disabled (adaptive: as enabled)
    budget_tokens: int | None = None


class CountRequest(msgspec.Struct, kw_only=True):
    """/v1/messages/count_tokens's body: what shapes the prompt."""

    model: str
    messages: list[MessageParam]
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountRequest, kw_only=True):
    """/v1/messages's body."""

    max_tokens: int
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = None
    metadata: dict[str, Any] | None = None  # accepted (user_id): the user is the API key's
