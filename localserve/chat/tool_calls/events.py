"""The events a tool-call parser gives, in the reply's order, and the complete calls.

Tested in tests/unit/chat/test_tool_calls.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """Reply text that is not a tool call."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A tool call begins: its place among the reply's calls, its id, the function's name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArguments:
    """A fragment of call `index`'s arguments, JSON text (the fragments concatenate to it)."""

    index: int
    fragment: str


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    """A complete call: `arguments` is a JSON object's text, as OpenAI's API carries it."""

    index: int
    id: str
    name: str
    arguments: str


ToolEvent = ContentDelta | ToolCallStart | ToolCallArguments


class ToolCallsFinished(NamedTuple):
    """What `finish()` gives: the events still held back, and every complete call."""

    events: list[ToolEvent]
    calls: list[ParsedToolCall]
