"""One reply read as it streams: its reasoning split off (chat/reasoning.py), then its answer
read for tool calls (chat/tool_calls/), as one list of events in the reply's order.

Either part may be off: without a reasoning format the whole reply is answer, without a tool
format (a request without tools, or `tool_choice: "none"`) the answer is all content. Reading
calls only when the request offered tools matters for the formats whose call is a bare JSON
object opening the reply (llama3, gemma): without tools, such a reply is an answer, and it
should not be held back until it is whole.

Tested in tests/unit/chat/test_reply.py and tests/unit/chat/test_scripted_replies.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from localserve.chat.reasoning import FORMATS as REASONING_FORMATS
from localserve.chat.reasoning import new_reasoning_parser
from localserve.chat.tool_calls import (
    PARSERS,
    ContentDelta,
    ParsedToolCall,
    ToolCallArguments,
    ToolCallStart,
    new_tool_parser,
)


@dataclass(frozen=True, slots=True)
class ReasoningText:
    """A piece of the reply's reasoning (OpenAI-style servers' `delta.reasoning_content`)."""

    text: str


ReplyEvent = ReasoningText | ContentDelta | ToolCallStart | ToolCallArguments


class ReplyFinished(NamedTuple):
    """What `finish()` gives: the events still held back, and every complete call."""

    events: list[ReplyEvent]
    calls: list[ParsedToolCall]


class ReplyReader:
    """Reads one reply; `prompt` is the rendered prompt (it may have opened the reasoning)."""

    def __init__(
        self,
        *,
        reasoning_format: str | None = None,
        tool_format: str | None = None,
        prompt: str = "",
        **tool_options,
    ) -> None:
        self._thinking = (
            new_reasoning_parser(reasoning_format, prompt) if reasoning_format else None
        )
        self._tools = new_tool_parser(tool_format, **tool_options) if tool_format else None
        self.preserved_tokens = preserved_tokens(reasoning_format, tool_format)

    def feed(self, delta: str) -> list[ReplyEvent]:
        """The events that `delta`, the next piece of the reply's text, settles."""
        if self._thinking is None:
            return self._answer(delta)
        reasoning, content = self._thinking.feed(delta)
        return ([ReasoningText(reasoning)] if reasoning else []) + self._answer(content)

    def finish(self) -> ReplyFinished:
        """The reply ended: what was held back, and the complete tool calls."""
        events: list[ReplyEvent] = []
        if self._thinking is not None:
            reasoning, content = self._thinking.finish()
            events += [ReasoningText(reasoning)] if reasoning else []
            events += self._answer(content)
        if self._tools is None:
            return ReplyFinished(events, [])
        finished = self._tools.finish()
        return ReplyFinished(events + finished.events, finished.calls)

    def _answer(self, text: str) -> list[ReplyEvent]:
        if self._tools is not None:
            return list(self._tools.feed(text))
        return [ContentDelta(text)] if text else []


def preserved_tokens(reasoning_format: str | None, tool_format: str | None) -> tuple[str, ...]:
    """The special tokens whose pieces the runner must render for these formats to be read."""
    tags = REASONING_FORMATS[reasoning_format] if reasoning_format else ()
    return (*tags, *(PARSERS[tool_format].preserved_tokens if tool_format else ()))
