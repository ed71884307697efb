"""`ToolCallParser`: feed a reply's text, get events; the holding back, the triggers and the
whitespace rules every format shares. A format's subclass reads one call at a trigger.

Tested in tests/unit/chat/test_tool_calls.py.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass

from localserve.chat.tool_calls.events import (
    ContentDelta,
    ParsedToolCall,
    ToolCallArguments,
    ToolCallsFinished,
    ToolCallStart,
    ToolEvent,
)
from localserve.chat.tool_calls.scanning import (
    SPACE,
    call_from_json,
    json_value_end,
    loads,
    skip_space,
)

MAX_CALL_CHARS = 256 * 1024  # the longest call (trigger to end) a parser holds back
_ALNUM = string.ascii_letters + string.digits


# --- what a format makes of the text at a trigger ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Found:
    """Calls read from the text at a trigger: `end` characters of it, (name, arguments) each."""

    end: int
    calls: list[tuple[str, dict]]


class NeedMore:
    """The text at the trigger may still become a call: wait for more."""


NEED_MORE = NeedMore()
Attempt = Found | NeedMore | None  # None: not a call (its trigger is text)


def random_alnum(n: int) -> str:
    """`n` random letters and digits (call ids are made of them)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(n))


def new_call_id() -> str:
    """An OpenAI-style call id: `call_` and 24 random letters and digits."""
    return "call_" + random_alnum(24)


class ToolCallParser:
    """The machinery every format shares: feed text, get events; a subclass says where a call
    may start (`triggers` anywhere, `opening_triggers` only before any content) and reads one
    at a trigger (`attempt`)."""

    triggers: tuple[str, ...] = ()
    opening_triggers: tuple[str, ...] = ()
    # the format's marks that are special tokens in its family's vocabularies: the runner must
    # render their pieces (llama.cpp's token_to_piece leaves control tokens out unless asked,
    # as llama-server keeps its formats' "preserved tokens")
    preserved_tokens: tuple[str, ...] = ()
    new_id: Callable[[], str] = staticmethod(new_call_id)

    def __init__(
        self, *, max_call_chars: int = MAX_CALL_CHARS, new_id: Callable[[], str] | None = None
    ) -> None:
        if max_call_chars < 1:
            raise ValueError(f"max_call_chars must be at least 1, not {max_call_chars}")
        self.max_call_chars = max_call_chars
        if new_id is not None:
            self.new_id = new_id
        self._held = ""  # text not given out yet
        # where scans of the held text stopped, so a call that waits for more costs each delta
        # only (the held text only grows until some of it is given out, which clears them)
        self._scans: dict[tuple[int, str], list] = {}
        self._searched: dict[tuple[str, int], int] = {}
        self._at_boundary = True  # at the reply's start or just after a call: whitespace held
        self._space = ""  # whitespace before a trigger: dropped if a call follows, else text
        self._has_content = False  # non-whitespace content given out (no opening triggers now)
        self._calls: list[ParsedToolCall] = []
        self._finished = False

    def feed(self, delta: str) -> list[ToolEvent]:
        """The events that `delta` (the next piece of the reply's text) settles."""
        if self._finished:
            raise ValueError("this tool-call parser has finished; start a new one per reply")
        self._held += delta
        return self._advance(final=False)

    def finish(self) -> ToolCallsFinished:
        """The reply ended: what was held back (an unfinished call is text) and all calls."""
        if self._finished:
            raise ValueError("this tool-call parser has already finished")
        events = self._advance(final=True)
        self._finished = True
        return ToolCallsFinished(events, list(self._calls))

    @property
    def calls(self) -> list[ParsedToolCall]:
        """The complete calls given out so far."""
        return list(self._calls)

    def attempt(self, text: str, final: bool) -> Attempt:
        """What the text at a trigger (`text` starts with it) is: calls, NEED_MORE, or None."""
        raise NotImplementedError

    # --- the scan --------------------------------------------------------------------------

    def _advance(self, final: bool) -> list[ToolEvent]:
        out: list[ToolEvent] = []
        while self._held:
            if self._at_boundary and not self._leave_boundary(final):
                break
            found = self._find_trigger()
            if found is None:
                keep = 0 if final else self._partial_trigger_len()
                self._give_text(out, len(self._held) - keep)
                break
            pos, trigger = found
            self._give_text(out, pos)
            result = self.attempt(self._held, final)
            if result is NEED_MORE and (final or len(self._held) > self.max_call_chars):
                result = None
            if result is NEED_MORE:
                break
            if result is None or result.end > self.max_call_chars:
                self._give_text(out, len(trigger))  # not a call: its trigger is text
                continue
            self._give_calls(out, result)
        return out

    def _leave_boundary(self, final: bool) -> bool:
        """Drop the whitespace after a call (or at the start) if a call follows it, keep it as
        text otherwise; False while that cannot be told yet."""
        j = skip_space(self._held, 0)
        rest = self._held[j:]
        if not rest:
            if final:
                self._drop(j)
            elif j > self.max_call_chars:
                self._at_boundary = False
            return final or not self._at_boundary
        starts = self.triggers + (() if self._has_content else self.opening_triggers)
        if any(rest.startswith(t) for t in starts):
            self._space += self._drop(j)
        elif not final and any(t.startswith(rest) for t in starts):
            return False
        self._at_boundary = False
        return True

    def _find_trigger(self) -> tuple[int, str] | None:
        """The first trigger in the held text: (position, trigger)."""
        if not self._has_content:
            for t in self.opening_triggers:
                if self._held.startswith(t):
                    return 0, t
        # each search resumes where the previous delta's stopped: a long call holds its text,
        # and searching all of it again for a trigger it lacks at every token is quadratic
        hits = [(p, t) for t in self.triggers if (p := self._find(self._held, t, 0)) >= 0]
        return min(hits) if hits else None

    def _partial_trigger_len(self) -> int:
        """The longest end of the held text that begins a trigger (held back until clear)."""
        longest = max((len(t) for t in self.triggers), default=1)
        for n in range(min(longest - 1, len(self._held)), 0, -1):
            tail = self._held[-n:]
            if any(t.startswith(tail) for t in self.triggers):
                return n
        return 0

    def _give_text(self, out: list[ToolEvent], n: int) -> None:
        text = self._drop(n)
        if text:
            text, self._space = self._space + text, ""
            out.append(ContentDelta(text))
            self._has_content = self._has_content or bool(text.strip(SPACE))

    def _give_calls(self, out: list[ToolEvent], found: Found) -> None:
        self._space = ""
        for name, args in found.calls:
            call = ParsedToolCall(len(self._calls), self.new_id(), name, _dumps(args))
            self._calls.append(call)
            out.append(ToolCallStart(call.index, call.id, call.name))
            out.append(ToolCallArguments(call.index, call.arguments))
        self._drop(found.end)
        self._at_boundary = True

    def _drop(self, n: int) -> str:
        """Take the first `n` held characters out (what was scanned of them is forgotten)."""
        taken, self._held = self._held[:n], self._held[n:]
        if n:
            self._scans.clear()
            self._searched.clear()
        return taken

    # --- what the formats use to read the held text, resuming where they stopped ------------

    def _value_end(self, text: str, start: int, quotes: str = '"') -> int | None:
        """json_value_end of the held text, resumed from the previous delta's scan."""
        return json_value_end(text, start, self._scans.setdefault((start, quotes), []), quotes)

    def _find(self, text: str, sub: str, start: int) -> int:
        """text.find(sub, start), not searching again what an earlier delta's search passed."""
        key = (sub, start)
        at = text.find(sub, max(start, self._searched.get(key, start) - len(sub) + 1))
        self._searched[key] = len(text) if at < 0 else at
        return at

    def _json_call_at(
        self, text: str, i: int, args_keys: tuple[str, ...]
    ) -> tuple[int, tuple[str, dict]] | NeedMore | None:
        """A JSON call object opening at `i`: (its end, the call), NEED_MORE, or None."""
        if i >= len(text):
            return NEED_MORE
        if text[i] != "{":
            return None
        key = skip_space(text, i + 1)
        if key < len(text) and text[key] != '"':
            return None  # "{}", "{ 1": not a call object, not held
        end = self._value_end(text, i)
        if end is None:
            return NEED_MORE
        call = call_from_json(loads(text[i:end]), args_keys)
        return None if call is None else (end, call)


def _dumps(args: dict) -> str:
    return json.dumps(args, ensure_ascii=False)
