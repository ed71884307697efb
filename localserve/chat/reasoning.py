"""A thinking model's reasoning split from its answer, incrementally, as the reply streams.

Thinking models write their reasoning first, between an open and a close tag, then the answer.
The formats (FORMATS), the families that write them and where they are written down:

- `think`: `<think>…</think>`: Qwen 3 (and its thinking switch `enable_thinking`), QwQ,
  DeepSeek-R1 and its Qwen/Llama distills, GLM-4.5; vLLM's `deepseek_r1` and `qwen3` reasoning
  parsers (vllm/reasoning/), llama.cpp's `--reasoning-format deepseek`. Magistral Small 2506
  also wrote these tags as plain text.
- `magistral`: `[THINK]…[/THINK]`, control tokens of Mistral's newer tokenizers: Magistral Small
  and Medium from 2507 on (mistral-common's docs; vLLM's `mistral` reasoning parser).

The other reasoning parsers in vLLM (Granite's "Here is my thought process:", Hunyuan's
`<answer>`, gpt-oss's channels, Step3) belong to families this server does not target yet.

Where the reasoning opens matters: the DeepSeek-R1 distills' templates (and QwQ's) end the
prompt with `<think>\\n`, so the reply starts inside the reasoning with no open tag. The parser
is told so (`started=True`; `prompt_opens_reasoning` reads it off the rendered prompt's end).
Otherwise only an open tag at the reply's start (after whitespace) opens reasoning; a reply
without one is all answer. There is one reasoning block: after its close tag everything is
answer, tags included. A block still open when the reply ends is reasoning (the model ran out
of tokens while thinking), so `finish()` gives what was held back as reasoning.

Whitespace opening the reasoning and opening the answer is dropped (the templates put newlines
around the tags); the rest is passed through as written. What is held back is at most a tag's
length less one character: a tag split across deltas at any point is still found, and the
result does not depend on how the text was split.

Tested in tests/unit/chat/test_reasoning.py and tests/unit/chat/test_scripted_replies.py.
"""

from __future__ import annotations

from typing import NamedTuple

# format -> (open tag, close tag); both are tokens of their family's vocabulary, and Mistral's are
# control tokens: the runner must render their pieces (llama.cpp's token_to_piece leaves control
# tokens out unless asked)
FORMATS: dict[str, tuple[str, str]] = {
    "think": ("<think>", "</think>"),
    "magistral": ("[THINK]", "[/THINK]"),
}
_SPACE = " \t\r\n"


class ReasoningDelta(NamedTuple):
    """What one piece of the reply adds to the reasoning and to the answer (either may be "")."""

    reasoning: str
    content: str


class ReasoningParser:
    """Splits one reply's text into reasoning and answer; one parser per reply."""

    def __init__(self, open_tag: str, close_tag: str, *, started: bool = False) -> None:
        if not open_tag or not close_tag:
            raise ValueError("the reasoning tags must not be empty")
        self.open_tag, self.close_tag = open_tag, close_tag
        self._state = "reasoning" if started else "start"  # start | reasoning | content
        self._strip = True  # drop whitespace until the current part's first other character
        self._held = ""
        self._finished = False

    @property
    def is_reasoning(self) -> bool:
        """Whether the text fed so far ends inside the reasoning."""
        return self._state == "reasoning"

    def feed(self, delta: str) -> ReasoningDelta:
        """The reasoning and answer text that `delta` settles."""
        if self._finished:
            raise ValueError("this reasoning parser has finished; start a new one per reply")
        self._held += delta
        reasoning, content = [], []
        while self._held and self._step(reasoning, content):
            pass
        return ReasoningDelta("".join(reasoning), "".join(content))

    def finish(self) -> ReasoningDelta:
        """The reply ended: what was held back (a partial tag) goes where it stood."""
        if self._finished:
            raise ValueError("this reasoning parser has already finished")
        out = self.feed("")
        self._finished = True
        held, self._held = self._held, ""
        if self._state == "reasoning":
            return ReasoningDelta(out.reasoning + held, out.content)
        return ReasoningDelta(out.reasoning, out.content + held)

    def _step(self, reasoning: list[str], content: list[str]) -> bool:
        """Settle what the held text allows; False when the rest must wait for more."""
        if self._strip:
            self._held = self._held.lstrip(_SPACE)
            if not self._held:
                return False
        if self._state == "start":
            if self._held.startswith(self.open_tag):
                self._held = self._held[len(self.open_tag) :]
                self._state, self._strip = "reasoning", True
                return True
            if self.open_tag.startswith(self._held):
                return False  # may still become the open tag
            self._state, self._strip = "content", False
            return True
        if self._state == "content":
            content.append(self._held)
            self._held, self._strip = "", False
            return False
        return self._reasoning_step(reasoning)

    def _reasoning_step(self, reasoning: list[str]) -> bool:
        self._strip = False
        end = self._held.find(self.close_tag)
        if end >= 0:
            reasoning.append(self._held[:end])
            self._held = self._held[end + len(self.close_tag) :]
            self._state, self._strip = "content", True
            return True
        keep = _partial_tag_len(self._held, self.close_tag)
        reasoning.append(self._held[: len(self._held) - keep])
        self._held = self._held[len(self._held) - keep :]
        return False


def _partial_tag_len(text: str, tag: str) -> int:
    """The longest end of `text` that begins `tag` (held back until it is clear)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def detect_reasoning_format(template: str | None) -> str | None:
    """The reasoning format a chat template's family writes, or None when it shows none."""
    if template and "[THINK]" in template:
        return "magistral"
    if template and "<think>" in template:
        return "think"
    return None


def prompt_opens_reasoning(prompt: str, name: str) -> bool:
    """Whether the rendered prompt ends inside an open reasoning block (R1 distills, QwQ), so
    the reply starts as reasoning without an open tag of its own."""
    open_tag, _ = _tags(name)
    return prompt.rstrip(_SPACE).endswith(open_tag)


def new_reasoning_parser(name: str, prompt: str = "") -> ReasoningParser:
    """A fresh parser for one reply in format `name`, started if `prompt` opened the block."""
    open_tag, close_tag = _tags(name)
    return ReasoningParser(open_tag, close_tag, started=prompt_opens_reasoning(prompt, name))


def _tags(name: str) -> tuple[str, str]:
    if name not in FORMATS:
        raise ValueError(f"unknown reasoning format {name!r}; one of {', '.join(FORMATS)}")
    return FORMATS[name]
