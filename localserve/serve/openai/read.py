"""A chat reply read as OpenAI's API shows it: content, `reasoning_content` and `tool_calls`.

The reply's text goes through its reading (serve/tool_use.py's `ReplyReading`: the reasoning
split off, the calls taken out, as the request asked); `ReadReply` turns what it gives into a
whole message's parts or into stream deltas (`{"content": ...}`, `{"reasoning_content": ...}`,
and `{"tool_calls": [{"index", "id", "type", "function": {"name", "arguments"}}]}` as OpenAI
streams them, by index).

Tested in tests/e2e/test_tool_calling.py; on a fake Frontdoor in tests/unit/serve/openai/.
"""

from __future__ import annotations

from typing import NamedTuple

from localserve.chat.reply import ReasoningText
from localserve.chat.tool_calls import ContentDelta, ToolCallArguments, ToolCallStart
from localserve.serve.tool_use import ReplyReading


class WholeReply(NamedTuple):
    content: str
    reasoning: str
    calls: list[dict]  # OpenAI's message.tool_calls


class ReadReply:
    def __init__(self, reading: ReplyReading) -> None:
        self.reading = reading

    @property
    def num_calls(self) -> int:
        return self.reading.num_calls

    def whole(self, text: str) -> WholeReply:
        events = self.reading.feed(text)
        held, calls = self.reading.finish()
        events += held
        content = "".join(e.text for e in events if isinstance(e, ContentDelta))
        reasoning = "".join(e.text for e in events if isinstance(e, ReasoningText))
        made = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
        return WholeReply(content, reasoning, made)

    def deltas(self, text: str, is_last: bool) -> list[dict]:
        """The stream deltas this piece of text settles (and, the last, what was held)."""
        events = self.reading.feed(text)
        if is_last:
            events += self.reading.finish()[0]
        out: list[dict] = []
        for event in events:
            delta = _delta(event)
            key = next(iter(delta))
            if out and key in ("content", "reasoning_content") and key in out[-1]:
                out[-1][key] += delta[key]  # one chunk for what came together
            else:
                out.append(delta)
        return out


def _delta(event) -> dict:
    if isinstance(event, ContentDelta):
        return {"content": event.text}
    if isinstance(event, ReasoningText):
        return {"reasoning_content": event.text}
    if isinstance(event, ToolCallStart):
        function = {"name": event.name, "arguments": ""}
        return {"tool_calls": [{"index": event.index, "id": event.id, "type": "function",
                                "function": function}]}  # fmt: skip
    assert isinstance(event, ToolCallArguments)
    return {"tool_calls": [{"index": event.index, "function": {"arguments": event.fragment}}]}
