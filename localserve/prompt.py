"""Chats to prompt text, per the model's `chat_format`.

- "template": llama.cpp's built-in chat template (by name from models.toml, or the GGUF's own).
- "transcript": a plain dialogue that a *base* model continues sensibly. The embedded Gemma 3
  270M is a base model: given its chat template it echoes the question back in a loop, given a
  transcript it answers ("User: What is the capital of France? / Assistant: The capital of
  France is Paris."). Generation stops where the model starts the user's next turn.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import NamedTuple

ROLES = ("system", "user", "assistant")
PREAMBLE = (
    "The following is a conversation between a curious user and a knowledgeable, helpful "
    "assistant. The assistant answers clearly and truthfully."
)
TRANSCRIPT_STOPS = ("\nUser:",)
MAX_CACHED_SYSTEM_CHARS = 16 << 10  # system prompts up to this long are cached (rendered, tokens)
_SPEAKERS = {"user": "User", "assistant": "Assistant"}


def check_messages(messages: Sequence[tuple[str, str]]) -> None:
    """Raise ValueError for an empty chat or an unknown role."""
    if not messages:
        raise ValueError("messages: at least one message is needed")
    for i, (role, _) in enumerate(messages):
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role: {role!r} is not one of {', '.join(ROLES)}")


def render_transcript(messages: Sequence[tuple[str, str]]) -> str:
    """A 'User: / Assistant:' dialogue ending with an open assistant turn."""
    system = [content for role, content in messages if role == "system"]
    lines = ["\n".join(system) if system else PREAMBLE, ""]
    lines += [f"{_SPEAKERS[r]}: {c.strip()}" for r, c in messages if r != "system"]
    lines.append("Assistant:")
    return "\n".join(lines)


class Rendered(NamedTuple):
    text: str
    stops: tuple[str, ...]  # stop strings the format needs
    # text[:system_chars] is the system prompt's part: requests that share it may share its KV
    system_chars: int
    is_default_system: bool  # that part is the server's own (configured or the preamble)


def render_chat(
    messages: Sequence[tuple[str, str]],
    chat_format: str,
    apply_template: Callable[[list[dict[str, str]]], str],
    system_prompt: str | None = None,
) -> Rendered:
    """The prompt text of a chat; `system_prompt` is the default for chats without one."""
    check_messages(messages)
    system = [c for r, c in messages if r == "system"]
    is_default = not system or system == [system_prompt]
    if not system and system_prompt is not None:
        messages = [("system", system_prompt), *messages]
    if chat_format == "transcript":
        text = render_transcript(messages)
        head = "\n".join(system) if system else PREAMBLE if system_prompt is None else system_prompt
        return Rendered(text, TRANSCRIPT_STOPS, len(head) + 2, is_default)
    text = apply_template([{"role": r, "content": c} for r, c in messages])
    return Rendered(text, (), _system_chars(messages, text, apply_template), is_default)


def _system_chars(messages, text: str, apply_template) -> int:
    """Where the system part of a templated prompt ends (0 without a system message).

    Templates place the system prompt differently (a turn of its own, or inside the first user
    turn), so render it before two different user messages: the common start is the part every
    chat with this system prompt shares.
    """
    system = tuple(c for r, c in messages if r == "system")
    if not system or messages[0][0] != "system":
        return 0
    # the cache holds its keys: only short system prompts go in (it is bounded in bytes)
    cached = sum(map(len, system)) <= MAX_CACHED_SYSTEM_CHARS
    head = (_template_head if cached else _template_head.__wrapped__)(system, apply_template)
    return len(head) if text.startswith(head) else 0


@functools.lru_cache(maxsize=64)  # the same system prompt comes with every chat
def _template_head(system: tuple[str, ...], apply_template) -> str:
    chats = ([*({"role": "system", "content": c} for c in system), {"role": "user", "content": x}]
             for x in ("a", "b"))  # fmt: skip
    return os.path.commonprefix([apply_template(chat) for chat in chats])
