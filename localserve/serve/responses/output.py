"""A response's output items, built from its reply as it is read, and the stream events that
write them, in the order OpenAI's SDK parses them.

The reply's reading (serve/tool_use.py's `ReplyReading`: reasoning split off, calls taken out)
gives text, reasoning and calls in the order the model wrote them; `Output` turns them into
items: a `reasoning` item (its text as `reasoning_text` content, as vLLM gives it), a `message`
item (one `output_text` part) and a `function_call` item per call. Each item is opened when its
first piece comes and closed when something else starts or the reply ends:

    response.output_item.added → response.content_part.added → response.output_text.delta … →
    response.output_text.done → response.content_part.done → response.output_item.done
    (reasoning: the same with response.reasoning_text.delta/.done; a call:
    output_item.added → function_call_arguments.delta → .done → output_item.done)

Every event carries its `sequence_number`, counted here for the whole stream (the lifecycle
events, response.created to response.completed, included). A reply with nothing in it gets an
empty message, so `output_text` is "" rather than missing. A whole reply is built by the same
class, its events unused.

Tested in tests/unit/serve/responses/test_create.py (the stream's events in order).
"""

from __future__ import annotations

import secrets

from localserve.chat.messages import ToolCallMade
from localserve.chat.reply import ReasoningText
from localserve.chat.tool_calls import ContentDelta, ToolCallArguments, ToolCallStart


def new_id(prefix: str) -> str:
    """An id as OpenAI's look: a prefix and 48 random hex digits."""
    return f"{prefix}_{secrets.token_hex(24)}"


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class Output:
    """One response's output items and the events that stream them."""

    def __init__(self) -> None:
        self.items: list[dict] = []  # closed items, in output order
        self.calls: list[ToolCallMade] = []
        self.content = ""  # the message's text (all of it, if several messages)
        self.sequence_number = 0
        self._open: dict | None = None  # the message or reasoning item being written
        self._text: list[str] = []
        self._start: ToolCallStart | None = None

    def event(self, kind: str, **fields) -> dict:
        out = {"type": kind, **fields, "sequence_number": self.sequence_number}
        self.sequence_number += 1
        return out

    def feed(self, events: list) -> list[dict]:
        """The stream events that the reply's events (ReplyReading's) settle."""
        out: list[dict] = []
        for e in events:
            if isinstance(e, ContentDelta):
                out += self._piece("message", e.text)
            elif isinstance(e, ReasoningText):
                out += self._piece("reasoning", e.text)
            elif isinstance(e, ToolCallStart):
                self._start = e
            elif isinstance(e, ToolCallArguments) and self._start is not None:
                out += self._call(self._start, e.fragment)
                self._start = None
        return out

    def finish(self, status: str = "completed") -> list[dict]:
        """The open item closed (`status` "incomplete" when the reply was cut short); an empty
        message when there was nothing at all."""
        out = self._close(status)
        if not self.items:
            out += self._piece("message", "") + self._close(status)
        return out

    # --- items ---

    def _piece(self, kind: str, text: str) -> list[dict]:
        out: list[dict] = []
        if self._open is None or self._open["type"] != kind:
            out += self._close("completed") + self._open_item(kind)
        if text:
            self._text.append(text)
            delta = "response.output_text.delta" if kind == "message" else \
                "response.reasoning_text.delta"  # fmt: skip
            extra = {"logprobs": []} if kind == "message" else {}
            out.append(self.event(delta, **self._where(), delta=text, **extra))
        return out

    def _open_item(self, kind: str) -> list[dict]:
        if kind == "message":
            item = {"id": new_id("msg"), "type": "message", "status": "in_progress",
                    "role": "assistant", "content": []}  # fmt: skip
            part = text_part("")
        else:
            item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": [],
                    "encrypted_content": None, "status": "in_progress"}  # fmt: skip
            part = {"type": "reasoning_text", "text": ""}
        self._open, self._text = item, []
        index = len(self.items)
        return [
            self.event("response.output_item.added", output_index=index, item=dict(item)),
            self.event("response.content_part.added", **self._where(), part=part),
        ]

    def _where(self) -> dict:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self.items), "content_index": 0}

    def _close(self, status: str) -> list[dict]:
        item = self._open
        if item is None:
            return []
        text = "".join(self._text)
        where = self._where()
        if item["type"] == "message":
            part = text_part(text)
            done = self.event("response.output_text.done", **where, text=text, logprobs=[])
            self.content += text
        else:
            part = {"type": "reasoning_text", "text": text}
            done = self.event("response.reasoning_text.done", **where, text=text)
        item = {**item, "content": [part], "status": status}
        out = [
            done,
            self.event("response.content_part.done", **where, part=part),
            self.event("response.output_item.done", output_index=where["output_index"], item=item),
        ]
        self.items.append(item)
        self._open = None
        return out

    def _call(self, start: ToolCallStart, arguments: str) -> list[dict]:
        out = self._close("completed")
        index = len(self.items)
        item = {"id": new_id("fc"), "type": "function_call", "status": "in_progress",
                "call_id": start.id, "name": start.name, "arguments": ""}  # fmt: skip
        where = {"item_id": item["id"], "output_index": index}
        done = {**item, "arguments": arguments, "status": "completed"}
        out += [
            self.event("response.output_item.added", output_index=index, item=item),
            self.event("response.function_call_arguments.delta", **where, delta=arguments),
            self.event(
                "response.function_call_arguments.done",
                **where,
                arguments=arguments,
                name=start.name,
            ),  # fmt: skip
            self.event("response.output_item.done", output_index=index, item=done),
        ]
        self.items.append(done)
        self.calls.append(ToolCallMade(start.id, start.name, arguments))
        return out
