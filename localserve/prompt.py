"""Chats to prompt text, per the model's `chat_format`.

- "template": llama.cpp's built-in chat template (by name from models.toml, or the GGUF's own).
- "transcript": a plain dialogue that a *base* model continues sensibly. The embedded Gemma 3
  270M is a base model: given its chat template it echoes the question back in a loop, given a
  transcript it answers ("User: What is the capital of France? / Assistant: The capital of
  France is Paris."). Generation stops where the model starts the user's next turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

ROLES = ("system", "user", "assistant")
PREAMBLE = (
    "The following is a conversation between a curious user and a knowledgeable, helpful "
    "assistant. The assistant answers clearly and truthfully."
)
TRANSCRIPT_STOPS = ("\nUser:",)
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


def render_chat(
    messages: Sequence[tuple[str, str]],
    chat_format: str,
    apply_template: Callable[[list[dict[str, str]]], str],
) -> tuple[str, tuple[str, ...]]:
    """Return (prompt text, stop strings the format needs)."""
    check_messages(messages)
    if chat_format == "transcript":
        return render_transcript(messages), TRANSCRIPT_STOPS
    return apply_template([{"role": r, "content": c} for r, c in messages]), ()
