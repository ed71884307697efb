"""A llama.cpp model's text side: tokens from text, special tokens' text, and its chat template
(a Jinja one rendered in chat/templates.py's sandbox, or one of llama.cpp's built-in ones);
`VocabOnly`, that side alone, for a process that builds prompts where no model runs.

Tested in tests/e2e/test_llama_runner.py and tests/e2e/test_jinja_gguf.py.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import llama_cpp

from localserve.chat.templates import ChatTemplate, ChatTemplateError, is_jinja
from localserve.config import ConfigError, ModelConfig, is_template_file
from localserve.runners import llama_backend  # noqa: F401  (llama.cpp set up before any load)

log = logging.getLogger("localserve.engine.runner")


class TokenText:
    """Text in and out of tokens with a model's vocabulary and chat template (`vocab` and the
    template are set by the class that loads the model, with `_load_template`)."""

    vocab = None
    _template: bytes | None = None  # a llama.cpp built-in template (a name, or marked text)
    _jinja: ChatTemplate | None = None  # the model's own Jinja template, rendered as HF does
    _template_error: ValueError | None = None  # why the configured template cannot be used
    _adds_bos = False  # the tokenizer puts the BOS in front by itself
    template_source: str | None = None  # the template's text (or built-in name), as configured

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        size = len(data) + 16
        while True:
            buf = (llama_cpp.llama_token * size)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, size, add_special, True)
            if n >= 0:
                return buf[:n]
            size = -n

    def _load_template(self, model, cfg: ModelConfig) -> None:
        """The template to use: a `.jinja` file or Jinja text from models.toml, a llama.cpp
        built-in name from models.toml, else the GGUF's own (Jinja; llama.cpp's marker-based
        guess when jinja2 cannot parse it)."""
        try:
            source = _template_source(model, cfg)
        except ValueError as e:
            self._template_error = e
            return
        self.template_source = source
        if source is None or not is_jinja(source):
            self._template = None if source is None else source.encode()
            return
        bos, eos = (_token_text(self.vocab, t) for t in _special_tokens(self.vocab))
        try:
            self._jinja = ChatTemplate(source, bos, eos)
        except ChatTemplateError as e:
            if cfg.chat_template:  # the operator's own template: say so at start-up
                self._template_error = e
                return
            log.warning("the GGUF's chat template: %s; using llama.cpp's built-in guess", e)
            self._template = source.encode()
        self._adds_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))

    def apply_chat_template(
        self, messages: list[dict], tools: list[dict] | None = None, **template_kwargs
    ) -> str:
        """Format a chat: the model's Jinja template (with `tools` and `template_kwargs` such as
        enable_thinking), or llama.cpp's built-in one. Raises ValueError naming the problem."""
        if self._template_error is not None:
            raise self._template_error
        if self._jinja is not None:
            text = self._jinja.render(messages, tools, template_kwargs)
            # the tokenizer adds the BOS itself (llama-server strips it the same way)
            bos = self._jinja.bos_token
            if self._adds_bos and bos and text.startswith(bos):
                text = text[len(bos) :]
            return text
        return self._apply_builtin(messages, tools)

    def _apply_builtin(self, messages: list[dict], tools: list[dict] | None) -> str:
        """llama.cpp's built-in template (no Jinja): roles and text only."""
        if self._template is None:
            raise ValueError("chat_template: the model has none; set one in models.toml")
        name = self._template.decode(errors="replace")
        what = repr(name) if len(name) <= 40 else "the model's Jinja template"
        if tools:
            raise ValueError(f"tools: llama.cpp's built-in chat template {what} cannot show tools")
        keep = [(m["role"].encode(), _text_of(m.get("content")).encode()) for m in messages]
        chat = (llama_cpp.llama_chat_message * len(keep))()
        for i, (role, content) in enumerate(keep):
            chat[i].role, chat[i].content = role, content
        size = sum(len(c) for _, c in keep) * 2 + 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_chat_apply_template(
                self._template, chat, len(keep), True, buf, size
            )
            if n < 0:
                raise ValueError(f"chat_template: llama.cpp does not know {what}")
            if n <= size:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = n


def _text_of(content) -> str:
    """A message's text: a string, or the text of its [{type: text, text}] parts."""
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def _special_tokens(vocab) -> tuple[int, int]:
    return llama_cpp.llama_vocab_bos(vocab), llama_cpp.llama_vocab_eos(vocab)


def _token_text(vocab, token: int) -> str:
    """A special token's text (BOS, EOS), "" when the vocabulary has none."""
    if token < 0:
        return ""
    return (llama_cpp.llama_vocab_get_text(vocab, token) or b"").decode("utf-8", errors="replace")


def _template_source(model, cfg: ModelConfig) -> str | None:
    """models.toml's chat_template (a `.jinja` file's text, Jinja text or a built-in name), else
    the GGUF's `tokenizer.chat_template`; None when neither has one."""
    configured = cfg.chat_template
    if is_template_file(configured):
        path = Path(configured).expanduser()
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"chat_template: cannot read {path}: {e}") from None
    if configured:
        return configured
    raw = llama_cpp.llama_model_chat_template(model, None)  # None if the GGUF has none
    return None if raw is None else raw.decode("utf-8", errors="replace")


class VocabOnly(TokenText):
    """A model's vocabulary and template alone (llama.cpp's vocab_only load: no weights, about
    0.4 s and 90 MB for Gemma's 262k tokens): prompts are built where no model runs."""

    def __init__(self, path: Path, cfg: ModelConfig) -> None:
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise ValueError(f"llama.cpp could not read the vocabulary of {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self._load_template(self.model, cfg)

    def close(self) -> None:
        if self.model is not None:
            llama_cpp.llama_model_free(self.model)
            self.model = None


def describe_template(text: TokenText) -> str:
    """The template as the model's info shows it: the Jinja source, or the built-in's name."""
    if text._jinja is not None:
        return text._jinja.source
    return (text._template or b"").decode(errors="replace")
