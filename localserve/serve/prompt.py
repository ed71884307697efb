"""The prompt builder: chats to prompt text (per the model's `chat_format`), then to tokens.

- "template": llama.cpp's built-in chat template (by name from models.toml, or the GGUF's own);
  `check_template` tries it once when the server starts.
- "transcript": a plain dialogue that a *base* model continues sensibly. The embedded Gemma 3
  270M is a base model: given its chat template it echoes the question back in a loop, given a
  transcript it answers ("User: What is the capital of France? / Assistant: The capital of
  France is Paris."). Generation stops where the model starts the user's next turn, and the
  space after "Assistant:" that the model's reply starts with is the format's, not the reply's
  (the engine drops it: `strip_space`). Offered tools are listed after its system part, with
  the Hermes call form (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) the
  reply is read for; calls and tool results in the history are written in the same form.

`PromptBuilder` renders and tokenizes off the event loop (in a thread at normal priority while
a small allowance lasts, else in a small pool of low-priority threads), says once
(`PromptTooLong`) when a prompt does not fit the context, and finds the system prompt's tokens
that requests may share; embedding inputs are tokenized in the same threads
(`embedding_inputs`). Given the reply's length (`[server] context_overflow = "truncate"`), a
chat longer than the context drops its oldest turns first (chat/fitting.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from localserve.chat.fitting import fit_chat
from localserve.chat.messages import ROLES, PromptMessage, as_prompt_message
from localserve.config import ConfigError
from localserve.engine.kv import common_prefix
from localserve.serve.embedding_inputs import tokenize_texts

TOOL_FORMAT_OF_TRANSCRIPTS = "hermes"  # how the transcript shows tools and reads calls
PREAMBLE = (
    "The following is a conversation between a curious user and a knowledgeable, helpful "
    "assistant. The assistant answers clearly and truthfully."
)
TRANSCRIPT_STOPS = ("\nUser:", "\nAssistant:", "\nTool:", "\nTool (")  # its role lines
MAX_CACHED_SYSTEM_CHARS = 16 << 10  # system prompts up to this long are cached (rendered, tokens)
_SPEAKERS = {"user": "User", "assistant": "Assistant", "tool": "Tool"}
TOOLS_INTRO = (
    "The assistant can call these functions (each given as JSON: its name, what it does, and "
    "a JSON Schema of its arguments):"
)
TOOLS_HOW = (
    "To call one, the assistant answers with only this, one line per call:\n"
    '<tool_call>{"name": "<function name>", "arguments": {<its arguments>}}</tool_call>\n'
    "The results come back as Tool lines."
)

# the `generic` call format's system part (a template that shows no tools: generic_chat)
GENERIC_TOOLS_INTRO = (
    "You can call these functions (each given as JSON: its name, what it does, and a JSON "
    "Schema of its arguments):"
)
GENERIC_TOOLS_HOW = (
    "To call one, answer with only a JSON object, one line per call, and nothing else:\n"
    '{"name": "<function name>", "arguments": {<its arguments>}}\n'
    "The results come back in the next message. When no call is needed, answer in words."
)

Messages = Sequence[PromptMessage | tuple]


def check_messages(messages: Messages) -> None:
    """Raise ValueError for an empty chat or an unknown role."""
    if not messages:
        raise ValueError("messages: at least one message is needed")
    for i, m in enumerate(messages):
        if m[0] not in ROLES:
            raise ValueError(f"messages[{i}].role: {m[0]!r} is not one of {', '.join(ROLES)}")


def check_template(name: str, chat_format: str, apply_template: Callable[..., str]) -> None:
    """At start-up, before any client: a "template" model renders a chat, or ConfigError naming
    the key (a model without a template, a name llama.cpp does not know) rather than a 400 that
    blames every client later. The transcript format needs no template."""
    if chat_format != "template":
        return
    try:
        apply_template([{"role": "user", "content": "Hello"}])
    except ValueError as e:
        why = str(e).removeprefix("chat_template: ").partition(";")[0]  # without its advice
        raise ConfigError(
            f"[models.{name}] chat_template: {why}; set chat_template to one of llama.cpp's "
            "built-in names (chatml, llama3, gemma, mistral-v7, phi4, ...) or chat_format = "
            '"transcript"'
        ) from None


def render_transcript(messages: Messages, tools: list | None = None) -> str:
    """A 'User: / Assistant:' dialogue ending with an open assistant turn."""
    messages = [as_prompt_message(m) for m in messages]
    system = [m.content for m in messages if m.role == "system"]
    lines = ["\n".join(system) if system else PREAMBLE, ""]
    if tools:
        lines[1:1] = ["", TOOLS_INTRO, *map(_json, tools), TOOLS_HOW]
    lines += [_transcript_line(m) for m in messages if m.role != "system"]
    lines.append("Assistant:")
    return "\n".join(lines)


def _transcript_line(m: PromptMessage) -> str:
    text = m.content.strip()
    if m.tool_calls:
        calls = (f'<tool_call>{{"name": {_json(c.name)}, "arguments": {c.arguments}}}</tool_call>'
                 for c in m.tool_calls)  # fmt: skip
        text = "\n".join([text, *calls]) if text else "\n".join(calls)
    if m.role == "tool" and m.name:
        return f"Tool ({m.name}): {text}"
    return f"{_SPEAKERS[m.role]}: {text}"


def _json(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def generic_chat(messages: list[PromptMessage], tools: list | None) -> list[PromptMessage]:
    """A chat with tools for a template that shows none (the `generic` call format, as
    llama.cpp's server does it): the tools listed in the system message with how to call one,
    earlier calls written into their assistant messages as the reply would write them, and each
    result a user turn (`Result of get_weather: ...`, results in a row one turn), since such
    templates know no `tool` role. A chat without tools or calls is left as it is."""
    if not tools and not any(m.tool_calls or m.role == "tool" for m in messages):
        return messages
    out: list[PromptMessage] = []
    for m in messages:
        if m.role == "tool":
            text = f"Result of {m.name}: {m.content}" if m.name else f"Result: {m.content}"
            m = PromptMessage("user", text)
        elif m.tool_calls:
            calls = (f'{{"name": {_json(c.name)}, "arguments": {c.arguments}}}'
                     for c in m.tool_calls)  # fmt: skip
            m = PromptMessage("assistant", "\n".join(filter(None, [m.content.strip(), *calls])))
        if out and m.role == "user" == out[-1].role:  # templates want turns to alternate
            m = PromptMessage("user", f"{out.pop().content}\n\n{m.content}")
        out.append(m)
    if tools:
        listed = "\n".join([GENERIC_TOOLS_INTRO, *map(_json, tools), GENERIC_TOOLS_HOW])
        if out[0].role == "system":
            listed = f"{out.pop(0).content}\n\n{listed}"
        out.insert(0, PromptMessage("system", listed))
    return out


class Rendered(NamedTuple):
    text: str
    stops: tuple[str, ...]  # stop strings the format needs
    # text[:system_chars] is the system prompt's part: requests that share it may share its KV
    system_chars: int
    is_default_system: bool  # that part is the server's own (configured or the preamble)
    strip_space: bool = False  # the reply starts with the format's space ("Assistant: ...")


def render_chat(
    messages: Messages,
    chat_format: str,
    apply_template: Callable[..., str],
    system_prompt: str | None = None,
    tools: list | None = None,
    template_kwargs: dict | None = None,
    describe_tools: bool = False,
) -> Rendered:
    """The prompt text of a chat; `system_prompt` is the default for chats without one.

    `tools`: the functions offered (OpenAI's function specs); `template_kwargs`: what a Jinja
    template reads beside the messages (enable_thinking, ...); `describe_tools`: the template
    shows no tools or calls (the `generic` call format), so the messages do (`generic_chat`)."""
    check_messages(messages)
    messages = [as_prompt_message(m) for m in messages]
    system = [m.content for m in messages if m.role == "system"]
    is_default = (not system or system == [system_prompt]) and not tools
    if not system and system_prompt is not None:
        messages = [PromptMessage("system", system_prompt), *messages]
    if chat_format == "transcript":
        text = render_transcript(messages, tools)
        head = "\n".join(system) if system else PREAMBLE if system_prompt is None else system_prompt
        system_chars = len(head) + 2 if not tools else 0  # the tools follow the system part
        return Rendered(text, TRANSCRIPT_STOPS, system_chars, is_default, strip_space=True)
    kwargs = template_kwargs or {}
    if describe_tools:
        messages, tools = generic_chat(messages, tools), None
    chat = [m.as_template() for m in messages]
    text = apply_template(chat, tools, **kwargs) if tools or kwargs else apply_template(chat)
    system_chars = _system_chars(messages, text, apply_template) if not tools else 0
    return Rendered(text, (), system_chars, is_default)


def _system_chars(messages: list[PromptMessage], text: str, apply_template) -> int:
    """Where the system part of a templated prompt ends (0 without a system message).

    Templates place the system prompt differently (a turn of its own, or inside the first user
    turn), so render it before two different user messages: the common start is the part every
    chat with this system prompt shares.
    """
    system = tuple(m.content for m in messages if m.role == "system")
    if not system or messages[0].role != "system":
        return 0
    # the cache holds its keys: only short system prompts go in (it is bounded in bytes)
    cached = sum(map(len, system)) <= MAX_CACHED_SYSTEM_CHARS
    head = (_template_head if cached else _template_head.__wrapped__)(system, apply_template)
    return len(head) if text.startswith(head) else 0


@functools.lru_cache(maxsize=64)  # the same system prompt comes with every chat
def _template_head(system: tuple[str, ...], apply_template) -> str:
    chats = (
        [*({"role": "system", "content": c} for c in system), {"role": "user", "content": x}]
        for x in ("a", "b")
    )
    return os.path.commonprefix([apply_template(chat) for chat in chats])


# --- tokens -------------------------------------------------------------------------------------

PROBE_CHARS_PER_TOKEN = 8  # a prompt this many chars a token long is probed before tokenizing
TOKENIZER_THREADS = 2  # chats are rendered and tokenized here, never on the event loop
TOKENIZER_NICENESS = 19  # ... at the lowest priority: llama.cpp's threads come first
# ... except while an allowance of characters lasts (refilled each second, at most one second's
# worth saved): those go to one thread at normal priority. At nice 19 a 3,000-token paste waited
# about a second for its 12 ms of tokenizing while two llama.cpp threads kept both cores busy
# (docs/benchmarks.md); the allowance bounds what a flood of prompts can take from the steps.
PROMPT_CHARS_PER_S = 32 << 10


class PromptTooLong(ValueError):
    """The formatted prompt does not fit in the context."""

    def __init__(self, num_tokens: int, n_ctx: int, at_least: bool = False) -> None:
        self.num_tokens, self.n_ctx, self.at_least = num_tokens, n_ctx, at_least
        over = "over " if at_least else ""
        super().__init__(f"the prompt has {over}{num_tokens} tokens; the context holds {n_ctx}")


class Prompt(NamedTuple):
    tokens: list[int]
    stops: tuple[str, ...]  # the format's own stop strings
    system_tokens: int  # the first ones are a system prompt that other requests may share
    is_default_system: bool  # the server's own system prompt: shared with every user
    strip_space: bool = False  # the format's space starts the reply: the engine drops it
    num_dropped_messages: int = 0  # the chat's oldest messages left out to fit the context
    tail: str = ""  # the rendered prompt's last characters (has it opened a reasoning block?)


TAIL_CHARS = 64


class ChatExtras(NamedTuple):
    """What a chat's prompt shows beside its messages."""

    tools: list | None = None  # the functions offered (OpenAI's function specs)
    template_kwargs: dict | None = None  # what a Jinja template reads (enable_thinking, ...)


NO_EXTRAS = ChatExtras()


class PromptBuilder:
    """Render and tokenize in threads (low priority past an allowance); one too-long check."""

    def __init__(
        self,
        tokenize: Callable[[str], list[int]],
        apply_template: Callable[..., str],
        n_ctx: int,
        chat_format: str,
        system_prompt: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        describe_tools: bool = False,
    ) -> None:
        self.tokenize = tokenize
        self.apply_template = apply_template
        self.n_ctx = n_ctx
        self.chat_format = chat_format
        self.system_prompt = system_prompt
        self.describe_tools = describe_tools  # the `generic` call format: the template shows none
        # the same system prompt comes with every chat: tokenize it once (thread-safe cache)
        self._system_tokens = functools.lru_cache(maxsize=64)(tokenize)
        self._pool = ThreadPoolExecutor(
            TOKENIZER_THREADS, "localserve-tokenize", initializer=_lower_priority
        )
        self._now = ThreadPoolExecutor(1, "localserve-tokenize-now")  # within the allowance
        self.clock = clock
        self._allowance = float(PROMPT_CHARS_PER_S)  # characters
        self._refilled = clock()

    async def chat(
        self,
        messages: Messages,
        reply_tokens: int | None = None,
        extras: ChatExtras = NO_EXTRAS,
    ) -> Prompt:
        """A conversation's prompt. Raises PromptTooLong, or ValueError for a bad chat.

        With `reply_tokens` (the reply's max_tokens), a chat whose prompt and reply do not fit
        drops its oldest turns (chat/fitting.py; room is kept for at most half the context's
        worth of reply); when even its system prompt and newest turn leave less room than that,
        the reply gets what is left (and may end at the context).
        PromptTooLong then means that the prompt alone does not fit. Without it, as for
        context_overflow = "refuse": PromptTooLong when the prompt does not fit.
        """
        size = sum(len(m[1]) for m in messages) + len(self.system_prompt or "")
        size += len(_json(extras.tools)) if extras.tools else 0
        chat = functools.partial(self._chat, reply_tokens=reply_tokens, extras=extras)
        return await self._run(chat, messages, size)

    async def text(self, text: str) -> Prompt:
        """A raw prompt (OpenAI's completions): the text as it is, nothing shared."""
        return await self._run(self._text, text, len(text))

    async def embedding_inputs(
        self, texts: Sequence[str], max_tokens: int, truncate: bool
    ) -> list[list[int]]:
        """Embedding inputs to tokens in the same threads and allowance as prompts (2,048 texts
        never tokenized on the event loop), each fitted to `max_tokens` (embedding_inputs.py:
        cut with `truncate`, else InputRefused naming the input)."""
        size = sum(map(len, texts))
        fit = functools.partial(
            tokenize_texts, tokenize=self.tokenize, max_tokens=max_tokens, truncate=truncate
        )
        return await self._run(fit, texts, size)

    def shutdown(self) -> None:
        for pool in (self._now, self._pool):
            pool.shutdown(wait=False, cancel_futures=True)

    async def _run(self, fn, arg, size: int) -> Prompt:
        pool = self._now if self._take_allowance(size) else self._pool
        return await asyncio.get_running_loop().run_in_executor(pool, fn, arg)

    def _take_allowance(self, size: int) -> bool:
        """Whether `size` characters still fit this second's normal-priority allowance."""
        now = self.clock()
        refill = (now - self._refilled) * PROMPT_CHARS_PER_S
        self._allowance = min(PROMPT_CHARS_PER_S, self._allowance + refill)
        self._refilled = now
        if size > self._allowance:
            return False
        self._allowance -= size
        return True

    def _chat(self, messages: Messages, reply_tokens: int | None, extras: ChatExtras) -> Prompt:
        num_dropped_messages = 0
        if reply_tokens is None:
            r = self._render(messages, extras)
            tokens = self._tokens(r.text)
        else:
            check_messages(messages)  # before any share of it is counted
            measure = functools.partial(self._measure, extras=extras)
            fitted = fit_chat(messages, self.n_ctx, reply_tokens, measure, self._count)
            r, tokens = fitted.payload
            if isinstance(tokens, PromptTooLong):  # even without every droppable turn
                raise tokens
            num_dropped_messages = fitted.num_dropped_messages
        # the system prompt's tokens as the prompt has them (a word may straddle the boundary)
        system_text = r.text[: r.system_chars]
        cached = len(system_text) <= MAX_CACHED_SYSTEM_CHARS  # the cache is bounded in bytes
        tokenize = self._system_tokens if cached else self.tokenize
        system = tokenize(system_text) if system_text else []
        system_tokens = common_prefix(system, tokens)
        return Prompt(
            tokens,
            r.stops,
            system_tokens,
            r.is_default_system,
            r.strip_space,
            num_dropped_messages,
            r.text[-TAIL_CHARS:],
        )

    def _render(self, messages: Messages, extras: ChatExtras) -> Rendered:
        return render_chat(
            messages,
            self.chat_format,
            self.apply_template,
            self.system_prompt,
            extras.tools,
            extras.template_kwargs,
            self.describe_tools,
        )

    def _measure(self, messages: Messages, extras: ChatExtras = NO_EXTRAS):
        """A chat's prompt, for fit_chat: (its token count, (rendered, tokens or PromptTooLong)).

        A prompt only probed (far too long) counts as its head's tokens scaled to its length: an
        estimate of the whole, where the head alone would understate what its turns take."""
        r = self._render(messages, extras)
        try:
            tokens = self._tokens(r.text)
        except PromptTooLong as e:
            probe = self.n_ctx * PROBE_CHARS_PER_TOKEN
            num = e.num_tokens * len(r.text) // probe if e.at_least else e.num_tokens
            return num, (r, e)
        return len(tokens), (r, tokens)

    def _count(self, content: str) -> int:
        """A message content's own tokens, for fit_chat (which adds what the format wraps it in)."""
        return len(self.tokenize(content, add_special=False))

    def _text(self, text: str) -> Prompt:
        if not text:
            raise ValueError("prompt: must not be empty")
        return Prompt(self._tokens(text), (), 0, False)

    def _tokens(self, text: str) -> list[int]:
        """The one too-long check: the prompt must leave a cell for the reply."""
        n_ctx, probe = self.n_ctx, self.n_ctx * PROBE_CHARS_PER_TOKEN
        if len(text) > probe and len(head := self.tokenize(text[:probe])) > n_ctx:
            # far too long: no need to tokenize all of it (up to max_frame_bytes) to say so
            raise PromptTooLong(len(head), n_ctx, at_least=True)
        tokens = self.tokenize(text)
        if len(tokens) >= n_ctx:
            raise PromptTooLong(len(tokens), n_ctx)
        return tokens


def _lower_priority() -> None:
    """Run this (tokenizer) thread at the lowest CPU priority.

    llama.cpp's threads meet at a barrier after every operation: a thread that loses its core
    to other work stalls the whole step. With two cores and two llama.cpp threads, tokenizing a
    pasted 250 KB prompt at normal priority stretched decode steps from 11 ms to over a second;
    at this priority they stay under 35 ms (benchmarks/hostile_user.py).
    """
    with contextlib.suppress(OSError, AttributeError):  # Linux: per thread; elsewhere: as is
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), TOKENIZER_NICENESS)
