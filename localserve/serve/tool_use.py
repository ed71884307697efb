"""A chat request's tools, thinking switch and the reading of its reply, for every front-end.

The websocket `chat` frame and the OpenAI API (and later front-ends) take the same fields:
`tools`, `tool_choice`, `parallel_tool_calls` and `chat_template_kwargs` (what a Jinja template
reads beside the messages, such as `enable_thinking`). `tool_use` checks them (chat/tools.py's
bounds; every model reads calls: one whose template shows no format has the `generic` one),
and for a forced call ("required" or
a named function) compiles the grammar that writes it (chat/tools.py, chat/constraints.py: off
the loop, bounded, cached). `ToolUse.reader` then reads the reply as it streams: its reasoning
split off and its calls taken out (chat/reply.py), or None when the reply is plain text.

Tested in tests/e2e/test_tool_calling.py.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, NamedTuple

from localserve.chat.constraints import ConstraintError
from localserve.chat.reply import ReplyEvent, ReplyReader
from localserve.chat.tool_calls import (
    ContentDelta,
    ParsedToolCall,
    ToolCallArguments,
    ToolCallStart,
)
from localserve.chat.tools import (
    ToolChoice,
    ToolsError,
    check_tool_choice,
    check_tools,
    forced_call_grammar,
)
from localserve.engine.sampling_params import Constraint
from localserve.serve.door import Frontdoor
from localserve.serve.prompt import ChatExtras

MAX_TEMPLATE_KWARGS = 16
MAX_KWARG_CHARS = 256


class ToolUseError(ValueError):
    """A bad tools field; `param` names it (tools, tool_choice, chat_template_kwargs, ...)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class ToolUse(NamedTuple):
    tools: list[dict]  # the offered functions, checked ([] for none)
    choice: ToolChoice
    parallel: bool  # more than one call in a reply
    template_kwargs: dict | None
    constraint: Constraint | None  # a forced call's grammar

    @property
    def extras(self) -> ChatExtras:
        """What the prompt shows beside the messages."""
        tools = self.tools if self.tools and self.choice.shows_tools else None
        return ChatExtras(tools, self.template_kwargs)

    def reading(self, door: Frontdoor, prompt_tail: str) -> ReplyReading | None:
        """The reply's reading; None when nothing in it is to be read (plain text)."""
        formats = door.formats
        tool_format = formats.tool if self.tools and self.choice.shows_tools else None
        if tool_format is None and formats.reasoning is None:
            return None
        reader = ReplyReader(
            reasoning_format=formats.reasoning, tool_format=tool_format, prompt=prompt_tail
        )
        return ReplyReading(reader, self.parallel, self.choice.is_forced)


class ReplyReading:
    """A reply read as it streams, as the request asked. Its calls are kept once each: a call
    identical to an earlier one of the same reply (the same function, the same arguments) is
    dropped, and the calls kept are numbered 0, 1, ... in the reply's order; with `parallel`
    off only the first is kept. A forced reply (its grammar writes calls only) gives no
    content, since text left over there is a call cut short by max_tokens."""

    def __init__(self, reader: ReplyReader, parallel: bool, forced: bool) -> None:
        self.reader = reader
        self.parallel = parallel
        self.forced = forced
        self.num_calls = 0  # calls kept so far
        self.num_dropped = 0  # repeated calls, or calls past the first without `parallel`
        self._index: dict[int, int] = {}  # the parser's index of a kept call -> its own
        self._seen: set[tuple[str, str]] = set()  # (name, canonical arguments) kept
        self._start: ToolCallStart | None = None  # a call whose arguments have not come yet

    def feed(self, text: str) -> list[ReplyEvent]:
        return self._kept(self.reader.feed(text)) if text else []

    def finish(self) -> tuple[list[ReplyEvent], list[ParsedToolCall]]:
        """What was held back, and the reply's calls (those kept, renumbered)."""
        finished = self.reader.finish()
        events = self._kept(finished.events)
        calls = [
            replace(call, index=self._index[call.index])
            for call in finished.calls
            if call.index in self._index
        ]
        return events, calls

    def _kept(self, events: list[ReplyEvent]) -> list[ReplyEvent]:
        kept: list[ReplyEvent] = []
        for event in events:
            if isinstance(event, ContentDelta):
                if event.text and not self.forced:
                    kept.append(event)
            elif isinstance(event, ToolCallStart):
                self._start = event  # a call comes whole: its arguments follow at once
            elif isinstance(event, ToolCallArguments):
                kept += self._call(event)
            elif event.text:
                kept.append(event)
        return kept

    def _call(self, arguments: ToolCallArguments) -> list[ReplyEvent]:
        start, self._start = self._start, None
        if start is None or start.index != arguments.index:  # not a call's: never given
            return []
        key = (start.name, _canonical_arguments(arguments.fragment))
        if key in self._seen or (self.num_calls and not self.parallel):
            self.num_dropped += 1
            return []
        self._seen.add(key)
        index = self._index[start.index] = self.num_calls
        self.num_calls += 1
        return [replace(start, index=index), ToolCallArguments(index, arguments.fragment)]


def _canonical_arguments(text: str) -> str:
    """Arguments compared as JSON values: the same object whatever its keys' order."""
    try:
        return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return text


NO_TOOLS = ToolUse([], ToolChoice("none"), True, None, None)


async def tool_use(
    door: Frontdoor,
    tools: Any = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool | None = None,
    template_kwargs: Any = None,
    has_response_format: bool = False,
) -> ToolUse:
    """A request's tool fields, checked; ToolUseError (a ValueError) naming the field."""
    kwargs = check_template_kwargs(template_kwargs)
    try:
        offered = check_tools(tools) if tools is not None else []
    except ToolsError as e:
        raise ToolUseError(_param_of(str(e), "tools"), str(e)) from None
    try:
        choice = check_tool_choice(tool_choice, offered)
    except ToolsError as e:
        raise ToolUseError("tool_choice", str(e)) from None
    formats = door.formats
    if offered and choice.shows_tools and formats.tool is None:  # a stand-in without formats
        raise ToolUseError("tools", "tools: this model reads no tool calls")
    # OpenAI's default lets an `auto` reply make several calls; a forced reply is one call
    # unless the request asks for several (`parallel_tool_calls: true`) in so many words
    parallel = parallel_tool_calls is True if choice.is_forced else parallel_tool_calls is not False
    constraint = None
    if choice.is_forced:
        if has_response_format:
            raise ToolUseError("tool_choice", "tool_choice: a forced call and a response_format "
                               "cannot both shape the reply")  # fmt: skip
        try:
            grammar = forced_call_grammar(formats.forced, offered, choice.name, parallel)
            constraint = await door.constraints.lark(grammar)
        except (ToolsError, ConstraintError) as e:
            raise ToolUseError("tools", f"tools: a forced call cannot be written: {e}") from None
    return ToolUse(offered, choice, parallel, kwargs, constraint)


def check_template_kwargs(kwargs: Any) -> dict | None:
    """`chat_template_kwargs`: a few named scalars (enable_thinking, ...), bounded."""
    if kwargs is None:
        return None
    where = "chat_template_kwargs"
    if not isinstance(kwargs, dict) or len(kwargs) > MAX_TEMPLATE_KWARGS:
        raise ToolUseError(where, f"{where}: an object of at most {MAX_TEMPLATE_KWARGS} keys")
    for key, value in kwargs.items():
        if not isinstance(key, str) or not key.isidentifier() or len(key) > 64:
            raise ToolUseError(where, f"{where}: {str(key)[:64]!r} is not a variable name")
        is_scalar = value is None or isinstance(value, bool | int | float)
        if not is_scalar and not (isinstance(value, str) and len(value) <= MAX_KWARG_CHARS):
            raise ToolUseError(
                f"{where}.{key}", f"{where}.{key}: a boolean, a number or a short string"
            )
    return dict(kwargs)


def _param_of(message: str, default: str) -> str:
    """The field a chat/tools.py message starts with ("tools[0].function.name: ...")."""
    head = message.split(":", 1)[0]
    return head if head.startswith(default) and " " not in head else default
