"""Chat templates as the model's authors wrote them: Hugging Face Jinja templates, rendered in a
sandbox with the variables those templates expect, bounded in time and size.

A GGUF's `tokenizer.chat_template` (or a `.jinja` file named in models.toml) is rendered the way
`transformers`' `apply_chat_template` renders it: jinja2's `ImmutableSandboxedEnvironment` with
`trim_blocks`, `lstrip_blocks` and loop controls, a `tojson` filter that keeps non-ASCII text, and
the globals `raise_exception` and `strftime_now`. The template sees `messages`, `tools`,
`add_generation_prompt`, `bos_token`, `eos_token` and any `chat_template_kwargs` (for instance
`enable_thinking`).

A template comes from a model file and the messages from users, and Jinja cannot be stopped from
outside: every render carries a `_Budget` (a deadline, a count of operations, a size) that the
sandbox checks from inside at each call, attribute or item lookup, loop iteration, string join
and intercepted operator, and at each chunk of output. A template that raises, loops, recurses
or grows something huge fails that render with `ChatTemplateError` (a ValueError: the server's
400 / `bad_request`), never a crash or a hung thread.
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_RENDER_S = 2.0  # wall-clock time one render may take
MAX_OPERATIONS = 2_000_000  # sandbox operations in one render (plus OPERATIONS_PER_MESSAGE)
OPERATIONS_PER_MESSAGE = 500  # real templates take tens per message
RENDER_GROWTH = 4  # a rendering (or any string inside it) may be this many times its input ...
RENDER_SLACK_CHARS = 256 << 10  # ... plus this (tool instructions, default system prompts)
MAX_TEMPLATE_CHARS = 1 << 20  # real templates are 1-30 KB
MAX_JSON_INDENT = 16
# variables the renderer sets; chat_template_kwargs may not replace them
RESERVED = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
    | {"raise_exception", "strftime_now", "namespace", "dict", "range"}
)
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # as transformers aliases them
_LONG_NUMBER = re.compile(r"\d{6,}")  # a format width or precision this long makes a huge string


class ChatTemplateError(ValueError):
    """A chat template that cannot render this chat (or at all); the message says why."""

    def __init__(self, why: str) -> None:
        super().__init__(f"chat_template: {why}")


def is_jinja(template: str) -> bool:
    """Whether a template is Jinja text rather than one of llama.cpp's built-in names."""
    return "{{" in template or "{%" in template


# --- the budget ----------------------------------------------------------------------------------


class _Budget:
    """What one render may still spend: checked from inside the sandbox."""

    def __init__(self, max_s: float, max_ops: int, max_chars: int) -> None:
        self.deadline = time.monotonic() + max_s
        self.max_s, self.ops_left, self.max_chars = max_s, max_ops, max_chars

    def tick(self) -> None:
        self.ops_left -= 1
        if self.ops_left < 0:
            raise ChatTemplateError("the template did too much work for this chat (a loop?)")
        if self.ops_left % 64 == 0 and time.monotonic() > self.deadline:
            raise ChatTemplateError(f"the template took over {self.max_s:g} s for this chat")

    def check_size(self, size: int) -> None:
        if size > self.max_chars:
            raise ChatTemplateError(
                f"the template made a text of over {self.max_chars:,} characters for this chat"
            )


_budget: contextvars.ContextVar[_Budget] = contextvars.ContextVar("localserve_template_budget")


def _spend() -> _Budget:
    budget = _budget.get()
    budget.tick()
    return budget


def _counted(iterable: Iterable) -> Iterator:
    """A loop's iterable, one operation per item (an empty loop body costs nothing otherwise)."""
    for item in iterable:
        _spend()
        yield item


def _concat(*parts: Any) -> str:
    """Jinja's `~` operator, refused before it builds something over the size bound."""
    texts = [str(p) for p in parts]
    _spend().check_size(sum(map(len, texts)))
    return "".join(texts)


# --- the sandbox ---------------------------------------------------------------------------------


def _sized(value: Any) -> int:
    return len(value) if isinstance(value, (str, list, tuple)) else 0


def _check_binop(op: str, left: Any, right: Any, budget: _Budget) -> None:
    """Refuse an operator whose result would be huge, before Python builds it."""
    if op == "*":
        n = right if isinstance(right, int) else left if isinstance(left, int) else 1
        budget.check_size(max(_sized(left), _sized(right)) * max(n, 0))
    elif op == "+":
        budget.check_size(_sized(left) + _sized(right))
    elif op == "**" and isinstance(left, int) and isinstance(right, int):
        if abs(left) > 1 and right * max(abs(left).bit_length(), 1) > 1 << 16:
            raise ChatTemplateError(f"the template computed a number too large ({left} ** {right})")
    elif op == "%" and isinstance(left, str) and _LONG_NUMBER.search(left):
        raise ChatTemplateError("the template formatted with a huge width or precision")


def _check_str_call(obj: Any, args: tuple, kwargs: dict, budget: _Budget) -> None:
    """Refuse the str methods that can grow a string hugely, before they run."""
    obj = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if not isinstance(owner, str):
        return
    ints = [a for a in (*args, *kwargs.values()) if isinstance(a, int)]
    if name in ("center", "ljust", "rjust", "zfill"):
        budget.check_size(max(ints, default=0))
    elif name == "expandtabs":
        budget.check_size(len(owner) + owner.count("\t") * max(ints, default=8))
    elif name == "replace" and len(args) >= 2:
        old, new = str(args[0]), str(args[1])
        count = owner.count(old) if old else len(owner) + 1
        budget.check_size(len(owner) + count * max(len(new) - len(old), 0))
    elif name in ("format", "format_map") and _LONG_NUMBER.search(owner):
        raise ChatTemplateError("the template formatted with a huge width or precision")


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, spending the render's budget at every step it takes."""

    intercepted_binops = frozenset({"*", "+", "**", "%"})

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
        budget = _spend()
        _check_str_call(__obj, args, kwargs, budget)
        result = super().call(__context, __obj, *args, **kwargs)
        budget.check_size(_sized(result))
        return result

    def getattr(self, obj, attribute):
        _spend()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        _spend()
        return super().getitem(obj, argument)

    def call_binop(self, context, operator, left, right):
        budget = _spend()
        _check_binop(operator, left, right, budget)
        return super().call_binop(context, operator, left, right)

    def _parse(self, source, name, filename):
        """Parse, then route every loop and `~` through the budget (see `_count_loops`)."""
        return _count_loops(super()._parse(source, name, filename))


def _count_loops(tree: jinja2.nodes.Template) -> jinja2.nodes.Template:
    """Wrap each for-loop's iterable in `_counted` and each `~` in `_concat`: the two steps a
    template can repeat without calling anything the sandbox sees."""

    def call(name: str, args: list) -> jinja2.nodes.Call:
        return jinja2.nodes.Call(jinja2.nodes.Name(name, "load"), args, [], None, None)

    for loop in tree.find_all(jinja2.nodes.For):
        loop.iter = call("_localserve_counted", [loop.iter])
    for parent in list(tree.find_all(jinja2.nodes.Node)):  # all of them before any changes
        for field in parent.fields:
            value = getattr(parent, field, None)
            if isinstance(value, jinja2.nodes.Concat):
                setattr(parent, field, call("_localserve_concat", value.nodes))
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, jinja2.nodes.Concat):
                        value[i] = call("_localserve_concat", item.nodes)
    return tree


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers marks assistant text with it):
    renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """transformers' `tojson`: json.dumps keeping non-ASCII text and HTML characters as they are."""
    width = len(indent) if isinstance(indent, str) else indent or 0
    if width > MAX_JSON_INDENT:
        raise ChatTemplateError(f"tojson: an indent of {width} is too wide")
    text = json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
    _budget.get().check_size(len(text))
    return text


class _Namespace(jinja2.utils.Namespace):
    """Jinja's namespace without underscore names (as transformers has it)."""

    def __init__(*args, **kwargs):  # noqa: N805 (jinja's own signature trick)
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with _")


def _sized_filter(fn: Callable, width_arg: int) -> Callable:
    """A string filter whose width argument is bounded by the render's size bound."""

    @functools.wraps(fn)
    def bounded(value, *args, **kwargs):
        width = args[width_arg - 1] if len(args) >= width_arg else kwargs.get("width", 0)
        if isinstance(width, int):
            lines = str(value).count("\n") + 1
            _budget.get().check_size(len(str(value)) + width * lines)
        elif isinstance(width, str):  # indent's width may be the indent itself
            lines = str(value).count("\n") + 1
            _budget.get().check_size(len(str(value)) + len(width) * lines)
        return fn(value, *args, **kwargs)

    return bounded


def _new_environment() -> _Sandbox:
    env = _Sandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    for name in ("center", "indent"):
        env.filters[name] = _sized_filter(env.filters[name], 1)
    env.filters["format"] = _checked_format(env.filters["format"])
    env.filters["replace"] = _checked_replace(env.filters["replace"])
    env.globals.update(
        raise_exception=_raise_exception,
        namespace=_Namespace,
        dict=lambda *args, **kwargs: dict(*args, **kwargs),
        _localserve_counted=_counted,
        _localserve_concat=_concat,
    )
    return env


def _checked_format(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def checked(value, *args, **kwargs):
        if _LONG_NUMBER.search(str(value)):
            raise ChatTemplateError("the template formatted with a huge width or precision")
        return fn(value, *args, **kwargs)

    return checked


def _checked_replace(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def checked(eval_ctx, value, old, new, count=None):
        text, old, new = str(value), str(old), str(new)
        n = text.count(old) if old else len(text) + 1
        _budget.get().check_size(len(text) + n * max(len(new) - len(old), 0))
        return fn(eval_ctx, value, old, new, count)

    return jinja2.pass_eval_context(checked)


_ENV = _new_environment()


@functools.lru_cache(maxsize=16)  # a server has a template or two; compiling takes milliseconds
def _compile(source: str) -> jinja2.Template:
    if len(source) > MAX_TEMPLATE_CHARS:
        raise ChatTemplateError(f"the template is over {MAX_TEMPLATE_CHARS:,} characters")
    try:
        return _ENV.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the template is not valid Jinja: line {e.lineno}: {e}") from None
    except RecursionError:
        raise ChatTemplateError("the template nests too deeply to compile") from None


# --- rendering -----------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A copy made of JSON types only: the template sees data, never the caller's objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    for base in (str, bool, int, float):  # subclasses (enums, numpy scalars) to the base type
        if isinstance(value, base):
            return base(value)
    raise ValueError(f"chat_template: {type(value).__name__} is not JSON data")


def _with_reasoning_aliases(message: dict) -> dict:
    """A message's reasoning under every name templates read it by (as transformers does)."""
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _num_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(k) + _num_chars(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(map(_num_chars, value))
    return 8


class ChatTemplate:
    """One compiled Jinja chat template with its model's BOS and EOS token texts."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        self._template = _compile(source)  # raises ChatTemplateError

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        *,
        add_generation_prompt: bool = True,
        now: Callable[[], datetime] = datetime.now,
        max_s: float = MAX_RENDER_S,
    ) -> str:
        """The prompt text of a chat; `template_kwargs` (a client's chat_template_kwargs, such as
        enable_thinking) become template variables. Raises ChatTemplateError (a ValueError) when
        the template refuses the chat, fails, or exceeds its time or size bound."""
        template_kwargs = template_kwargs or {}
        clash = sorted(RESERVED & template_kwargs.keys())
        if clash:
            raise ValueError(f"chat_template_kwargs: {clash[0]!r} is set by the server")
        chat = [_with_reasoning_aliases(m) for m in _plain(messages)]
        tools, extra = _plain(tools), _plain(template_kwargs)
        size = _num_chars(chat) + _num_chars(tools) + _num_chars(extra)
        max_ops = MAX_OPERATIONS + OPERATIONS_PER_MESSAGE * len(chat)
        budget = _Budget(max_s, max_ops, RENDER_GROWTH * size + RENDER_SLACK_CHARS)
        variables = {
            **extra,
            "messages": chat,
            "tools": tools,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "strftime_now": lambda fmt: now().strftime(str(fmt)[:64]),
        }
        token = _budget.set(budget)
        try:
            return _generate(self._template, variables, budget)
        finally:
            _budget.reset(token)


def _generate(template: jinja2.Template, variables: dict, budget: _Budget) -> str:
    """Render chunk by chunk, checking time and size at each chunk."""
    chunks, size = [], 0
    try:
        for chunk in template.generate(**variables):
            size += len(chunk)
            budget.check_size(size)
            budget.tick()
            chunks.append(chunk)
    except ChatTemplateError:
        raise
    except jinja2.exceptions.SecurityError as e:
        raise ChatTemplateError(f"the template tried something the sandbox forbids: {e}") from None
    except jinja2.exceptions.UndefinedError as e:
        raise ChatTemplateError(f"the template failed on this chat: {e}") from None
    except jinja2.exceptions.TemplateError as e:  # raise_exception(...) in the template
        raise ChatTemplateError(f"the template refused this chat: {e}") from None
    except RecursionError:
        raise ChatTemplateError("the template recursed too deeply for this chat") from None
    except MemoryError:
        raise ChatTemplateError("the template ran out of memory for this chat") from None
    except Exception as e:  # noqa: BLE001 (any failure of untrusted template code is its own)
        why = f"{type(e).__name__}: {e}"
        raise ChatTemplateError(f"the template failed on this chat: {why}") from None
    return "".join(chunks)
