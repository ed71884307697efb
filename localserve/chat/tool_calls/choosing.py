"""Choosing the call format: the parsers by name, the format a chat template gives away
(`auto`), and a fresh parser for one reply.

Tested in tests/unit/chat/test_tool_calls.py and tests/unit/chat/test_scripted_replies.py.
"""

from __future__ import annotations

from typing import get_args

from localserve.chat.tool_calls.deepseek import DeepSeekParser
from localserve.chat.tool_calls.gemma import GemmaParser
from localserve.chat.tool_calls.generic import GenericParser
from localserve.chat.tool_calls.hermes import HermesParser
from localserve.chat.tool_calls.llama3 import Llama3Parser
from localserve.chat.tool_calls.mistral import MistralParser
from localserve.chat.tool_calls.parser import ToolCallParser
from localserve.config import ToolFormat

FORMATS: tuple[str, ...] = get_args(ToolFormat)

PARSERS: dict[str, type[ToolCallParser]] = {
    "hermes": HermesParser,
    "llama3": Llama3Parser,
    "mistral": MistralParser,
    "gemma": GemmaParser,
    "deepseek": DeepSeekParser,
    "generic": GenericParser,
}

# what in a chat template gives its family's format away, most specific first
_TEMPLATE_MARKS: tuple[tuple[str, str], ...] = (
    ("<｜tool▁calls▁begin｜>", "deepseek"),
    ("[TOOL_CALLS]", "mistral"),
    ("<tool_call>", "hermes"),
    ("<|python_tag|>", "llama3"),
    ("ipython", "llama3"),
    ("```tool_code", "gemma"),
    ("<start_of_turn>", "gemma"),
)


# llama.cpp's built-in templates (models.toml's chat_template may name one) by family
_BUILTIN_TEMPLATES = {"gemma": "gemma", "llama3": "llama3"} | {
    name: "mistral"
    for name in ("mistral-v3", "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken")
}


def detect_tool_format(template: str | None) -> str | None:
    """The call format a chat template's family writes (the template's text, or the name of one
    of llama.cpp's built-in templates), or None when the template shows none."""
    if template in _BUILTIN_TEMPLATES:
        return _BUILTIN_TEMPLATES[template]
    for mark, name in _TEMPLATE_MARKS:
        if template and mark in template:
            return name
    return None


def choose_tool_format(configured: str, template: str | None) -> str:
    """`models.toml`'s `tool_format` ("auto": read from the template, `generic` where it shows
    none: the tools described in a system message, the calls read as JSON)."""
    if configured == "auto":
        return detect_tool_format(template) or "generic"
    if configured not in PARSERS:
        raise ValueError(f"unknown tool format {configured!r}; one of {', '.join(FORMATS)}")
    return configured


def new_tool_parser(name: str, **options) -> ToolCallParser:
    """A fresh parser for one reply in format `name` (options: max_call_chars, new_id)."""
    if name not in PARSERS:
        raise ValueError(f"unknown tool format {name!r}; one of {', '.join(FORMATS)}")
    return PARSERS[name](**options)
