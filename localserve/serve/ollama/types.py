"""The Ollama API's request bodies, as msgspec decodes them.

Fields are None when not given; unknown fields are ignored (clients send many), but a known
field of the wrong type is a 400 that names it. `Options` holds the sampling options Ollama's
`options` object carries (the model-loading ones, num_ctx, num_gpu ..., are ignored: the server
has one model loaded with its own settings).

Tested in tests/e2e/test_ollama_api.py; on a fake Frontdoor in tests/unit/serve/ollama/.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Options(msgspec.Struct, kw_only=True):
    """Ollama's `options`: the ones that sample a reply (the rest are accepted and ignored)."""

    num_predict: int | None = None  # max_tokens; -1 (and -2) mean "as long as allowed"
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    seed: int | None = None
    stop: list[str] | None = None


class CallFunction(msgspec.Struct, kw_only=True):
    name: str
    arguments: dict[str, Any] | str = msgspec.field(default_factory=dict)


class CallMade(msgspec.Struct, kw_only=True):
    """A call an assistant message made (Ollama's: no id, the arguments an object)."""

    function: CallFunction


class OllamaMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | None = None
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[CallMade] | None = None
    tool_name: str | None = None  # a tool message: the function that answered


class OllamaFields(msgspec.Struct, kw_only=True):
    """Fields /api/chat and /api/generate both take."""

    model: str | None = None  # None: the server's model
    stream: bool | None = None  # None: true, Ollama's default
    format: str | dict[str, Any] | None = None  # "json" or a JSON schema
    options: Options | None = None
    keep_alive: str | int | float | None = None  # the model's idle time from now on (pool.py)
    think: bool | str | None = None  # true/false, or a level ("low", "medium", "high")


class ChatRequest(OllamaFields, kw_only=True):
    messages: list[OllamaMessage] = msgspec.field(default_factory=list)
    tools: list[Any] | None = None


class GenerateRequest(OllamaFields, kw_only=True):
    prompt: str | None = None
    system: str | None = None
    raw: bool | None = None
    suffix: str | None = None
    images: list[str] | None = None
    template: str | None = None
    context: list[int] | None = None


class EmbedRequest(OllamaFields, kw_only=True):
    """/api/embed's body (and the legacy /api/embeddings', whose input is `prompt`)."""

    input: str | list[str] | None = None
    prompt: str | None = None  # /api/embeddings
    truncate: bool | None = None  # None: true, Ollama's default
    dimensions: int | None = None


class PullRequest(msgspec.Struct, kw_only=True, rename={"as_name": "localserve_name"}):
    """/api/pull's body: the model (`name` in older clients); `localserve_name`, the entry's
    name in models.toml (localserve's extension; default: `localserve pull`'s)."""

    model: str | None = None
    name: str | None = None
    insecure: bool | None = None
    stream: bool | None = None
    as_name: str | None = None


class ModelRequest(msgspec.Struct, kw_only=True):
    """/api/show's body: the model (`name` in older clients)."""

    model: str | None = None
    name: str | None = None
    verbose: bool | None = None
