"""The Responses API's request body as msgspec decodes it.

Every field OpenAI's `POST /v1/responses` takes is named here, so that a field of it that
localserve does not do is refused by name (checks.py), and a field nobody knows is refused by
the decoder (`forbid_unknown_fields`: its message names the field). None = not given (some
clients send explicit nulls). `input` items and `tools` stay JSON values here: items.py and
checks.py read them, bounded, and name the item or tool that is wrong.

Tested in tests/unit/serve/responses/test_create.py.
"""

from __future__ import annotations

from typing import Any

import msgspec


class ResponsesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str | None = None  # None: the server's default model
    input: str | list[Any] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None  # {"format": {...}, "verbosity": ...}
    reasoning: dict[str, Any] | None = None  # {"effort", "summary"}: taken, not acted on
    previous_response_id: str | None = None
    store: bool | None = None  # None: true, as OpenAI's
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None  # {"include_obfuscation"}: nothing to hide
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: str | None = None  # "disabled" or "auto": the server's context_overflow rules
    service_tier: str | None = None
    prompt_cache_key: str | None = None  # prefixes are cached per person whatever it says
    safety_identifier: str | None = None
    seed: int | None = None  # localserve's extension (as its chat completions)
    # OpenAI's, refused when they ask for something (checks.py)
    background: bool | None = None
    conversation: Any = None
    include: list[Any] | None = None
    prompt: Any = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    prompt_cache_retention: str | None = None
