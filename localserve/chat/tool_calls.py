"""Tool calls read out of a model's streamed text, one incremental parser per call format.

Each open model family writes its calls its own way; a parser is told the format (from
`models.toml`'s `tool_format`, or guessed from the chat template by `detect_tool_format`) and
fed the reply's text as it is sampled. It gives back events in the reply's order: `ContentDelta`
(text around the calls, passed through), `ToolCallStart` (index, id, function name) and
`ToolCallArguments` (a fragment of the arguments' JSON text, for OpenAI's streamed
`delta.tool_calls[i].function.arguments`); `finish()` gives the last events and every complete
`ParsedToolCall`.

The formats (FORMATS), and where they are written down:

- `hermes`: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, several in a row
  for parallel calls. Hermes 2 Pro / 3, Qwen 2.5 (and Coder), QwQ, Qwen 3: NousResearch's
  Hermes-Function-Calling README and the Qwen function-calling docs (qwen.readthedocs.io,
  "Function Calling"); vLLM's `hermes` parser.
- `llama3`: `{"name": ..., "parameters": {...}}` at the start of the reply, or after
  `<|python_tag|>`, several separated by `;`. Llama 3.1, 3.2, 3.3: Meta's llama-models
  "prompt format" docs for 3.1 (JSON-based tool calling); vLLM's `llama3_json` parser, llama.cpp's
  `common/chat.cpp` (LLAMA_3_X). Llama 3.1's built-in tools (`<|python_tag|>brave_search.call(...)`)
  are not JSON and come out as text.
- `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral 7B v0.3, Nemo,
  Small 3.0/3.1, Large 2) and `[TOOL_CALLS]name[ARGS]{...}`, repeated for parallel calls, or
  `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}` as Mistral Small 3.2's template writes it (Small 3.2,
  Magistral, Devstral): mistral-common's tokenizer docs; vLLM's `mistral` parser. Mistral's
  templates refuse call ids that are not 9 letters and digits, so this format's ids are such.
- `gemma`: Gemma 3 has no tool tokens: a framework reads calls from the shape it prompted for.
  Google's "Function calling with Gemma" guide (ai.google.dev/gemma/docs/capabilities/
  function-calling) gives two prompts: a Python list of calls as the whole reply,
  `[name(arg=value, ...), other(...)]` (vLLM's `pythonic` parser, used with its Gemma 3 template,
  reads this), or a JSON object `{"name": ..., "parameters": {...}}` (what the community Gemma 3
  tool templates for Ollama ask for); Google's Gemma cookbook and agent guides wrap the Python
  calls in a fenced ```` ```tool_code ```` block instead. All three are read: the list and the
  JSON object opening the reply, the block anywhere. llama.cpp has no Gemma format of its own
  (it falls back to its generic JSON one). Python arguments must be keywords with literal
  values, read with `ast.literal_eval`, never run.

- `deepseek`: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name` + newline +
  a ```` ```json ```` block of the arguments + `<｜tool▁call▁end｜>`, more calls, then
  `<｜tool▁calls▁end｜>`: DeepSeek V3, R1 and the R1 distills (their templates write this);
  vLLM's `deepseek_v3` parser, llama.cpp's DeepSeek R1 format.

Rules every format keeps:

- The events do not depend on how the text was split into deltas: feeding it whole or a
  character at a time gives the same content and the same calls.
- Text that only might start a call (a partial `<tool_c`, or a call not finished yet) is held
  back until it is clear; what is held is bounded by `max_call_chars` (a longer call is text).
- A call is given out only once it is whole and well-formed, so a call the model left
  unfinished, or wrote with bad JSON or an unknown shape, comes out as plain text, never an
  exception, and nothing given out has to be taken back. Its arguments therefore come in one
  `ToolCallArguments` fragment: the arguments re-encoded as JSON (json.dumps, non-ASCII kept).
- Whitespace between calls, before a first call opening the reply and after the last one
  ending it is dropped; all other text is given out as it came.

The special tokens some formats use (`<|python_tag|>`, `[TOOL_CALLS]`, `[ARGS]`: a parser's
`preserved_tokens`) must be in the text the parser is fed: the runner has to render those
tokens' pieces, which llama.cpp leaves out of a control token's piece unless asked.

Tested in tests/unit/chat/test_tool_calls.py and tests/unit/chat/test_scripted_replies.py.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, get_args

from localserve.config import ToolFormat

FORMATS: tuple[str, ...] = get_args(ToolFormat)
MAX_CALL_CHARS = 256 * 1024  # the longest call (trigger to end) a parser holds back
MAX_NAME_CHARS = 64  # OpenAI's limit on a function name
_ALNUM = string.ascii_letters + string.digits
_SPACE = " \t\r\n"


# --- events ----------------------------------------------------------------------------------


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


# --- what a format makes of the text at a trigger ---------------------------------------------


@dataclass(frozen=True, slots=True)
class _Found:
    """Calls read from the text at a trigger: `end` characters of it, (name, arguments) each."""

    end: int
    calls: list[tuple[str, dict]]


class _NeedMore:
    """The text at the trigger may still become a call: wait for more."""


NEED_MORE = _NeedMore()
Attempt = _Found | _NeedMore | None  # None: not a call (its trigger is text)


_MARKS = {  # what matters outside a string, and inside one (by its quote)
    '"': re.compile(r'["\\{}\[\]]'),
    "\"'": re.compile(r"[\"'\\{}\[\]]"),
}
_STRING_MARKS = {'"': re.compile(r'["\\]'), "'": re.compile(r"['\\]")}


def json_value_end(
    text: str, start: int, resume: list | None = None, quotes: str = '"'
) -> int | None:
    """The index just past the JSON object or array opening at `start`; None if it is not closed
    yet. Only brackets and strings are followed: whether the value is valid is json's to say.
    With `quotes="\"'"` it follows a Python literal's brackets the same way.

    `resume` (an empty list at first, kept by the caller while `text` only grows) carries where
    the scan stopped, so a call each delta costs the delta, not the whole text again."""
    state = resume if resume is not None else []
    if not state:
        state.extend((start, 0, ""))
    i, depth, quote = state
    if depth < 0:
        return i  # closed at i by an earlier call
    while True:
        m = (_STRING_MARKS[quote] if quote else _MARKS[quotes]).search(text, i)
        if m is None:
            i = len(text)
            break
        c, i = m.group(), m.end()
        if c == "\\":
            if i == len(text):
                i -= 1  # the escaped character has not come yet: look again from the backslash
                break
            i += 1
        elif c in "\"'":
            quote = "" if quote else c
        elif c in "{[":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                state[:] = (i, -1, "")
                return i
    state[:] = (i, depth, quote)
    return None


def _loads(text: str) -> object:
    """json.loads, None for text that is not JSON (or nests past the decoder's depth)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def call_from_json(value: object, args_keys: tuple[str, ...]) -> tuple[str, dict] | None:
    """(name, arguments) of a call object `{"name": ..., <args key>: {...}}`, or None.

    The arguments may also be a JSON string holding an object (some models write them so);
    missing arguments are an empty object; a key outside the call's shape makes it not a call."""
    if not isinstance(value, dict) or not _is_name(value.get("name")):
        return None
    if set(value) - {"name", "type", "id", *args_keys} or value.get("type", "function") != (
        "function"
    ):
        return None
    present = [k for k in args_keys if k in value]
    if len(present) > 1:
        return None
    args = value[present[0]] if present else {}
    if isinstance(args, str):
        args = _loads(args)
    return (value["name"], args) if isinstance(args, dict) else None


def _is_name(name: object) -> bool:
    return isinstance(name, str) and 0 < len(name) <= MAX_NAME_CHARS and name.strip() == name


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in _SPACE:
        i += 1
    return i


# --- the parser ------------------------------------------------------------------------------


def new_call_id() -> str:
    """An OpenAI-style call id: `call_` and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


def new_mistral_call_id() -> str:
    """A call id Mistral's templates accept: 9 random letters and digits."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


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
        j = _skip_space(self._held, 0)
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
            self._has_content = self._has_content or bool(text.strip(_SPACE))

    def _give_calls(self, out: list[ToolEvent], found: _Found) -> None:
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
    ) -> tuple[int, tuple[str, dict]] | _NeedMore | None:
        """A JSON call object opening at `i`: (its end, the call), NEED_MORE, or None."""
        if i >= len(text):
            return NEED_MORE
        if text[i] != "{":
            return None
        key = _skip_space(text, i + 1)
        if key < len(text) and text[key] != '"':
            return None  # "{}", "{ 1": not a call object, not held
        end = self._value_end(text, i)
        if end is None:
            return NEED_MORE
        call = call_from_json(_loads(text[i:end]), args_keys)
        return None if call is None else (end, call)


def _dumps(args: dict) -> str:
    return json.dumps(args, ensure_ascii=False)


# --- the formats -----------------------------------------------------------------------------


class HermesParser(ToolCallParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`: Hermes, Qwen 2.5, QwQ, Qwen 3.

    A last call whose closing tag never came is still a call if its JSON is whole and nothing
    but whitespace follows it (models sometimes stop right after the object)."""

    open_tag, close_tag = "<tool_call>", "</tool_call>"
    triggers = (open_tag,)
    preserved_tokens = (open_tag, close_tag)
    args_keys = ("arguments", "parameters")

    def attempt(self, text: str, final: bool) -> Attempt:
        start = len(self.open_tag)
        end = self._find(text, self.close_tag, start)
        if end < 0 and not final:
            return NEED_MORE
        call = call_from_json(_loads(text[start : end if end >= 0 else len(text)]), self.args_keys)
        if call is None:
            return None
        return _Found(end + len(self.close_tag) if end >= 0 else len(text), [call])


class Llama3Parser(ToolCallParser):
    """`{"name": ..., "parameters": {...}}` opening the reply or after `<|python_tag|>`; several
    separated by `;`: Llama 3.1, 3.2, 3.3."""

    python_tag = "<|python_tag|>"
    triggers = (python_tag,)
    opening_triggers = ("{",)
    preserved_tokens = (python_tag,)
    args_keys = ("parameters", "arguments")

    def attempt(self, text: str, final: bool) -> Attempt:
        i = _skip_space(text, len(self.python_tag)) if text.startswith(self.python_tag) else 0
        calls: list[tuple[str, dict]] = []
        end = i
        while True:
            got = self._json_call_at(text, i, self.args_keys)
            if got is NEED_MORE and calls and final:
                return _Found(i, calls)  # a trailing `;` ends the list
            if not isinstance(got, tuple):
                return got if not calls or got is NEED_MORE else _Found(end, calls)
            end, call = got
            calls.append(call)
            j = _skip_space(text, end)
            if j == len(text) and not final:
                return NEED_MORE  # a `;` and another call may follow
            if j == len(text) or text[j] != ";":
                return _Found(end, calls)
            i = _skip_space(text, j + 1)


class MistralParser(ToolCallParser):
    """`[TOOL_CALLS][{...}, ...]` and `[TOOL_CALLS]name[ARGS]{...}`: Mistral, Nemo, Small,
    Magistral, Devstral. Call ids are 9 letters and digits, as Mistral's templates demand (an
    id the model wrote after `[CALL_ID]` is read past, not kept)."""

    tag, args_tag, id_tag = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
    triggers = (tag,)
    preserved_tokens = (tag, args_tag, id_tag)
    new_id = staticmethod(new_mistral_call_id)
    _name = re.compile(r"[A-Za-z0-9_.\-]+")
    _call_id = re.compile(r"[A-Za-z0-9]*")

    def attempt(self, text: str, final: bool) -> Attempt:
        i = _skip_space(text, len(self.tag))
        if i == len(text):
            return NEED_MORE
        if text[i] == "[":
            return self._list_form(text, i)
        name = self._name.match(text, i)
        if name is None or len(name.group()) > MAX_NAME_CHARS:
            return None
        j = name.end()
        if text.startswith(self.id_tag, j):
            j = self._call_id.match(text, j + len(self.id_tag)).end()
        if not text.startswith(self.args_tag, j):
            rest = text[j:]
            return (
                NEED_MORE
                if self.args_tag.startswith(rest) or self.id_tag.startswith(rest)
                else None
            )
        k = j + len(self.args_tag)
        if k == len(text):
            return NEED_MORE
        if text[k] != "{":
            return None
        end = self._value_end(text, k)
        if end is None:
            return NEED_MORE
        args = _loads(text[k:end])
        return _Found(end, [(name.group(), args)]) if isinstance(args, dict) else None

    def _list_form(self, text: str, i: int) -> Attempt:
        end = self._value_end(text, i)
        if end is None:
            return NEED_MORE
        value = _loads(text[i:end])
        if not isinstance(value, list) or not value:
            return None
        calls = [call_from_json(v, ("arguments",)) for v in value]
        return None if None in calls else _Found(end, calls)


class GemmaParser(ToolCallParser):
    """Gemma 3: Python calls in a ```` ```tool_code ```` block anywhere; or, opening the reply, a
    Python list of calls `[f(a=1), g(b="x")]` or a JSON call object `{"name": ..., "parameters":
    {...}}` (the two forms Google's function-calling guide prompts for)."""

    fence = "```tool_code"
    triggers = (fence,)
    opening_triggers = ("[", "{")
    args_keys = ("parameters", "arguments")

    def attempt(self, text: str, final: bool) -> Attempt:
        if text.startswith("{"):
            got = self._json_call_at(text, 0, self.args_keys)
            return _Found(got[0], [got[1]]) if isinstance(got, tuple) else got
        if text.startswith("["):
            opening = _CALL_OPENING.match(text)
            if opening is None:
                return None
            if opening.end() == len(text):
                return NEED_MORE  # "[", "[get_wea", "[get_weather ": a call may still come
            if text[opening.end()] != "(":
                return None  # "[1, 2]", "[a link](...)", "[Note: ...": not calls, not held
            end = self._value_end(text, 0, quotes="\"'")
            if end is None:
                return NEED_MORE
            calls = pythonic_calls(text[:end])
            return _Found(end, calls) if calls else None
        return self._block(text)

    def _block(self, text: str) -> Attempt:
        header_end = self._find(text, "\n", len(self.fence))
        if header_end < 0:
            return NEED_MORE if not text[len(self.fence) :].strip(" \t\r") else None
        if text[len(self.fence) : header_end].strip(" \t\r"):
            return None  # ```tool_codefoo: another fence
        close = self._find(text, "```", header_end)
        if close < 0:
            return NEED_MORE
        calls = pythonic_calls(text[header_end:close])
        return _Found(close + 3, calls) if calls else None


class DeepSeekParser(ToolCallParser):
    """`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name\\n```json\\n{...}\\n```
    <｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`: DeepSeek V3, R1 and the R1 distills' templates."""

    calls_begin, calls_end = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    call_begin, call_end = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
    triggers = (calls_begin, call_begin, calls_end)
    preserved_tokens = (calls_begin, calls_end, call_begin, call_end, "<｜tool▁sep｜>")
    _call = re.compile(r"\s*(\w+)<｜tool▁sep｜>([^\n]+)\n```(?:json)?\n(.*)\n```\s*", re.DOTALL)

    def attempt(self, text: str, final: bool) -> Attempt:
        if text.startswith(self.calls_begin):  # the list's wrapper, with its first call
            i = _skip_space(text, len(self.calls_begin))
            if not text.startswith(self.call_begin, i):
                return NEED_MORE if self.call_begin.startswith(text[i:]) else None
            return self._call_at(text, i)
        if text.startswith(self.calls_end):  # the wrapper's end, after calls only
            return _Found(len(self.calls_end), []) if self._calls else None
        return self._call_at(text, 0)

    def _call_at(self, text: str, i: int) -> Attempt:
        end = self._find(text, self.call_end, i + len(self.call_begin))
        if end < 0:
            return NEED_MORE
        m = self._call.fullmatch(text, i + len(self.call_begin), end)
        if m is None or m.group(1) != "function" or not _is_name(m.group(2).strip()):
            return None
        args = _loads(m.group(3))
        if not isinstance(args, dict):
            return None
        return _Found(end + len(self.call_end), [(m.group(2).strip(), args)])


_CALL_OPENING = re.compile(r"\[\s*(?:[A-Za-z_][\w.]*\s*)?")  # "[" and a function's name


def pythonic_calls(code: str) -> list[tuple[str, dict]] | None:
    """The calls in Python call syntax — `f(a=1)` lines, or a list `[f(a=1), g(b="x")]` — as
    (name, arguments); None unless every statement is such a call with literal keyword values.
    The code is parsed, never run."""
    try:
        tree = ast.parse(code.strip(), mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    nodes: list[ast.expr] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            return None
        value = stmt.value
        nodes.extend(value.elts if isinstance(value, ast.List | ast.Tuple) else [value])
    calls = [_pythonic_call(node) for node in nodes]
    return None if not calls or None in calls else calls


def _pythonic_call(node: ast.expr) -> tuple[str, dict] | None:
    if not isinstance(node, ast.Call) or node.args:
        return None
    name = _dotted_name(node.func)
    if name is None or not _is_name(name):
        return None
    args = {}
    for kw in node.keywords:
        if kw.arg is None:
            return None  # **kwargs
        try:
            value = ast.literal_eval(kw.value)
            json.dumps(value, allow_nan=False)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return None
        args[kw.arg] = _jsonable(value)
    return name, args


def _dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted_name(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _jsonable(value: object) -> object:
    """A literal json.dumps accepted, as JSON reads it back: tuples as lists, keys as strings."""
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


# --- choosing the format ---------------------------------------------------------------------

PARSERS: dict[str, type[ToolCallParser]] = {
    "hermes": HermesParser,
    "llama3": Llama3Parser,
    "mistral": MistralParser,
    "gemma": GemmaParser,
    "deepseek": DeepSeekParser,
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


def choose_tool_format(configured: str, template: str | None) -> str | None:
    """`models.toml`'s `tool_format` ("auto": read from the template); None: no format known."""
    if configured == "auto":
        return detect_tool_format(template)
    if configured not in PARSERS:
        raise ValueError(f"unknown tool format {configured!r}; one of {', '.join(FORMATS)}")
    return configured


def new_tool_parser(name: str, **options) -> ToolCallParser:
    """A fresh parser for one reply in format `name` (options: max_call_chars, new_id)."""
    if name not in PARSERS:
        raise ValueError(f"unknown tool format {name!r}; one of {', '.join(FORMATS)}")
    return PARSERS[name](**options)
