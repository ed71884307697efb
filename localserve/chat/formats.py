"""Which call and reasoning formats a model writes: read once from its configuration and its
chat template, for the prompt (forcing a call), the runner (the special tokens it must render
as text) and the reply (what it is read for).

A transcript-format model (the embedded base model) is shown tools in the Hermes form by the
prompt builder and read for it; a template model's formats come from models.toml's
`tool_format` and `reasoning_format` ("auto": from the template's text, or the name of one of
llama.cpp's built-in templates).

Tested in tests/unit/chat/test_reply.py.
"""

from __future__ import annotations

from typing import NamedTuple

from localserve.chat.reasoning import FORMATS as REASONING_FORMATS
from localserve.chat.reasoning import detect_reasoning_format
from localserve.chat.reply import preserved_tokens
from localserve.chat.tool_calls import choose_tool_format


class ModelFormats(NamedTuple):
    tool: str | None  # the parser of its calls (chat/tool_calls/), None: no tools
    reasoning: str | None  # the parser of its reasoning (chat/reasoning.py), None: no split
    forced: str | None  # the form a forced call is written in (chat/tools.py)

    @property
    def preserved_tokens(self) -> tuple[str, ...]:
        return preserved_tokens(self.reasoning, self.tool)


def model_formats(
    chat_format: str,
    template: str | None,
    tool_format: str = "auto",
    reasoning_format: str = "auto",
) -> ModelFormats:
    if chat_format == "transcript":
        return ModelFormats("hermes", None, "transcript")
    tool = choose_tool_format(tool_format, template) if tool_format != "none" else None
    if reasoning_format == "auto":
        reasoning = detect_reasoning_format(template)
    elif reasoning_format == "none":
        reasoning = None
    elif reasoning_format in REASONING_FORMATS:
        reasoning = reasoning_format
    else:
        raise ValueError(f"reasoning_format: {reasoning_format!r} is not auto, none or one of "
                         f"{', '.join(REASONING_FORMATS)}")  # fmt: skip
    return ModelFormats(tool, reasoning, tool)
