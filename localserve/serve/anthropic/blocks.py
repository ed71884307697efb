"""A reply's content blocks as Anthropic shows them, built as its text is read.

The reply's reading (serve/tool_use.py: its reasoning split off, its calls taken out) gives
events; `Blocks` turns them into the stream's block events, `content_block_start`,
`content_block_delta` (text_delta, thinking_delta, input_json_delta) and `content_block_stop`,
and keeps the whole blocks (`content`) for a reply sent whole: text, thinking (with a
`signature`: SIGNATURE, empty, since localserve signs nothing and reads nothing back from it)
and tool_use (its `input` the call's arguments as an object). A new kind of text, or a new
call, stops the block before it and starts its own, as the official API streams them.

Tested in tests/e2e/test_anthropic_api.py; on a fake Frontdoor in tests/unit/serve/anthropic/.
"""

from __future__ import annotations

import json
from typing import Any

from localserve.chat.reply import ReasoningText
from localserve.chat.tool_calls import ContentDelta, ToolCallArguments, ToolCallStart

SIGNATURE = ""  # a thinking block's signature: localserve's reasoning is not signed
TOOL_ID_PREFIX = "toolu_"  # Anthropic's tool_use ids start so


class Blocks:
    def __init__(self) -> None:
        self.content: list[dict[str, Any]] = []  # the blocks so far, whole
        self.open: Any = None  # what the last block holds: "text", "thinking" or a call index
        self._calls: dict[int, int] = {}  # a call's index to its block's
        self._arguments: dict[int, list[str]] = {}  # a tool_use block's input, as JSON text

    def feed(self, events: list) -> list[dict]:
        """The stream events these reading events make."""
        out: list[dict] = []
        for event in events:
            if isinstance(event, ContentDelta) and event.text:
                out += self._into("text", {"type": "text", "text": ""})
                self.content[-1]["text"] += event.text
                out.append(self._delta(len(self.content) - 1, "text_delta", "text", event.text))
            elif isinstance(event, ReasoningText) and event.text:
                start = {"type": "thinking", "thinking": "", "signature": SIGNATURE}
                out += self._into("thinking", start)
                self.content[-1]["thinking"] += event.text
                out.append(self._delta(len(self.content) - 1, "thinking_delta", "thinking",
                                       event.text))  # fmt: skip
            elif isinstance(event, ToolCallStart):
                block = {"type": "tool_use", "id": tool_id(event.id), "name": event.name,
                         "input": {}}  # fmt: skip
                out += self._into(("call", event.index), block, new=True)
                self._calls[event.index] = len(self.content) - 1
                self._arguments[len(self.content) - 1] = []
            elif isinstance(event, ToolCallArguments) and event.index in self._calls:
                at = self._calls[event.index]
                self._arguments[at].append(event.fragment)
                out.append(self._delta(at, "input_json_delta", "partial_json", event.fragment))
        return out

    def close(self) -> list[dict]:
        """The last block's stop (none when there are no blocks)."""
        if self.open is None:
            return []
        at = len(self.content) - 1
        out = []
        if self.open == "thinking":
            out.append(self._delta(at, "signature_delta", "signature", SIGNATURE))
        if at in self._arguments:
            self.content[at]["input"] = _input("".join(self._arguments[at]))
        self.open = None
        return [*out, {"type": "content_block_stop", "index": at}]

    def _into(self, kind: Any, start: dict, new: bool = False) -> list[dict]:
        """Stay in the open block if it is of `kind`, else stop it and start one."""
        if self.open == kind and not new:
            return []
        out = self.close()
        self.content.append(start)
        self.open = kind
        block = dict(start)  # as it starts: the one kept grows
        return [*out, {"type": "content_block_start", "index": len(self.content) - 1,
                       "content_block": block}]  # fmt: skip

    @staticmethod
    def _delta(index: int, kind: str, key: str, value: str) -> dict:
        return {"type": "content_block_delta", "index": index, "delta": {"type": kind, key: value}}


def tool_id(call_id: str) -> str:
    return call_id if call_id.startswith(TOOL_ID_PREFIX) else TOOL_ID_PREFIX + call_id


def _input(text: str) -> Any:
    """A call's arguments as its block's input: the JSON object ({} if it is not one: a call
    cut short, which the reply's stop_reason says)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
