"""Jinja chat templates (localserve/chat/templates.py): real templates of six model families
render exactly as transformers renders them, and hostile templates or chats fail that render
with a clear error, quickly, without taking the thread with them."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from localserve.chat import templates as templates_module
from localserve.chat.templates import (
    MAX_RENDER_S,
    ChatTemplate,
    ChatTemplateError,
    is_jinja,
)
from tests.support.paths import ROOT

DATA = Path(__file__).resolve().parents[2] / "data" / "templates"
SPEC = json.loads((DATA / "conversations.json").read_text(encoding="utf-8"))
NOW = datetime.fromisoformat(SPEC["now"])
CASES = [(stem, case) for stem in SPEC["tokens"] for case in SPEC["cases"]]
HELLO = [{"role": "user", "content": "Hello"}]


def template(stem: str) -> ChatTemplate:
    bos, eos = SPEC["tokens"][stem]
    return ChatTemplate((DATA / f"{stem}.jinja").read_text(encoding="utf-8"), bos, eos)


def render(t: ChatTemplate, chat: dict) -> str:
    return t.render(
        chat["messages"],
        chat.get("tools"),
        chat.get("kwargs"),
        add_generation_prompt=chat.get("add_generation_prompt", True),
        now=lambda: NOW,
    )


@pytest.mark.parametrize(("stem", "case"), CASES, ids=[f"{s}-{c}" for s, c in CASES])
def test_a_real_template_renders_as_transformers_does(stem, case):
    expected = DATA / "expected" / stem
    chat = SPEC["cases"][case]
    if (expected / f"{case}.error").exists():  # transformers' template refused it too
        with pytest.raises(ChatTemplateError) as e:
            render(template(stem), chat)
        assert (expected / f"{case}.error").read_text(encoding="utf-8") in str(e.value)
        return
    want = (expected / f"{case}.txt").read_bytes().decode("utf-8")
    assert render(template(stem), chat) == want


def test_the_families_cover_tools_and_thinking():
    assert len({s.split("-")[0] for s in SPEC["tokens"]}) >= 5
    qwen3 = DATA / "expected" / "Qwen-Qwen3-0.6B"
    off, on = ((qwen3 / f"thinking-{x}.txt").read_text(encoding="utf-8") for x in ("off", "on"))
    assert off.endswith("<think>\n\n</think>\n\n") and not on.endswith("</think>\n\n")
    assert "get_weather" in (qwen3 / "tools.txt").read_text(encoding="utf-8")


def test_a_template_is_compiled_once():
    source = (DATA / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    assert ChatTemplate(source)._template is ChatTemplate(source)._template


def test_jinja_is_told_from_a_built_in_name():
    assert is_jinja("{{ bos_token }}{% for m in messages %}{% endfor %}")
    assert not is_jinja("gemma") and not is_jinja("chatml")


def test_a_syntax_error_names_the_line():
    why = r"^chat_template: the template is not valid Jinja: line 2"
    with pytest.raises(ChatTemplateError, match=why):
        ChatTemplate("ok\n{% for m in messages %}")


def test_raise_exception_refuses_the_chat_with_the_templates_words():
    t = ChatTemplate("{{ raise_exception('Only user and assistant roles are supported!') }}")
    with pytest.raises(ChatTemplateError, match="refused this chat: Only user and assistant"):
        t.render(HELLO)


def test_an_undefined_attribute_is_a_clear_error():
    with pytest.raises(ChatTemplateError, match="failed on this chat"):
        ChatTemplate("{{ messages[0].nothing.deeper }}").render(HELLO)


def test_strftime_now_and_template_kwargs_reach_the_template():
    t = ChatTemplate("{{ strftime_now('%d %b %Y') }} {{ enable_thinking }} {{ bos_token }}", "<s>")
    text = t.render(HELLO, None, {"enable_thinking": False}, now=lambda: NOW)
    assert text == "15 Jan 2026 False <s>"


def test_template_kwargs_cannot_replace_the_servers_variables():
    with pytest.raises(ValueError, match="chat_template_kwargs: 'bos_token' is set by the server"):
        ChatTemplate("{{ bos_token }}").render(HELLO, None, {"bos_token": "<s>"})


def test_template_kwargs_are_template_variables_never_the_renders_own_bounds():
    source = "{{ max_s }} {{ now }}" + HOSTILE["nested-loops"]
    error, _ = render_in_a_child(source, HELLO, {"max_s": 1e9, "now": "x"})
    assert error is not None and ("too much work" in error or "took over" in error), error


def test_tojson_keeps_text_as_it_is_and_takes_transformers_arguments():
    t = ChatTemplate("{{ x | tojson }}|{{ x | tojson(indent=2, sort_keys=true) }}")
    want = '{"b": "é<", "a": 1}|{\n  "a": 1,\n  "b": "é<"\n}'
    assert t.render(HELLO, None, {"x": {"b": "é<", "a": 1}}) == want


def test_the_sandbox_forbids_python_internals():
    with pytest.raises(ChatTemplateError, match="sandbox forbids|failed on this chat"):
        ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}").render(HELLO)
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{% set ns = namespace(_x=1) %}").render(HELLO)


def test_concatenation_and_loops_still_mean_what_they_meant():
    t = ChatTemplate(
        "{% for m in messages %}{{ loop.index }}/{{ loop.length }} "
        "{{ m.role ~ ':' ~ (m.content ~ '!') }}"
        "{% if loop.last %}.{% endif %} {% endfor %}{% for i in range(3) %}{% if i == 1 %}"
        "{% continue %}{% endif %}{{ i }}{% endfor %}"
    )
    chat = [*HELLO, {"role": "assistant", "content": "Hi"}]
    assert t.render(chat) == "1/2 user:Hello! 2/2 assistant:Hi!. 02"


def test_the_generation_tag_renders_its_body():
    assert ChatTemplate("{% generation %}hi{% endgeneration %}").render(HELLO) == "hi"


LOOP, END = "{% for i in range(100000) %}", "{% endfor %}"
NS = "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
FN = "{% macro f(n) %}"
HOSTILE = {
    "nested-loops": LOOP + LOOP + END + END,
    "loops-with-output": LOOP + LOOP + "x" + END + END,
    "string-multiplication": "{{ 'x' * 1000000000 }}",
    "list-multiplication": "{% set l = [1] * 1000000000 %}",
    "doubling-by-tilde": NS + "{% set ns.s = ns.s ~ ns.s %}" + END,
    "nested-tilde": NS + "{% set ns.s = (ns.s ~ ('' ~ ns.s)) %}" + END,
    "doubling-by-plus": NS + "{% set ns.s = ns.s + ns.s %}" + END,
    "deep-recursion": FN + "{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "exponential-recursion": FN + "{% if n < 64 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}"
    "{% endmacro %}{{ f(0) }}",
    "huge-power": "{{ 10 ** 100000000 }}",
    "huge-format": "{{ '%0999999999d' % 1 }}",
    "huge-format-method": "{{ '{:>999999999}'.format(1) }}",
    "huge-center": "{{ 'x'.center(1000000000) }}",
    "huge-center-filter": "{{ 'x' | center(1000000000) }}",
    "huge-replace": "{{ ('x' * 100000).replace('x', 'y' * 100000) }}",
    "huge-indent": "{{ messages | tojson(indent=100000) }}",
    "huge-indent-text": "{{ ('x\n' * 100000) | indent('y' * 100000) }}",
    "recursive-loop": "{% for m in [1] recursive %}{{ loop([1, 2]) }}{% endfor %}",
}


# A render the budget fails to stop runs on, or takes the machine's memory: each hostile render
# is a child process of its own, bounded in memory, killed when it outlasts the budget.
RENDER_IN_A_CHILD = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from localserve.chat.templates import ChatTemplate, ChatTemplateError
source, messages, kwargs = json.load(sys.stdin)
start = time.monotonic()
try:
    ChatTemplate(source).render(messages, None, kwargs)
    error = None
except ChatTemplateError as e:
    error = str(e)
print(json.dumps({"error": error, "s": time.monotonic() - start}))
"""
CHILD_START_S = 10  # a Python started and localserve.chat imported, on a busy machine


def render_in_a_child(
    source: str, messages: list[dict], template_kwargs: dict | None = None
) -> tuple[str | None, float]:
    """The render's ChatTemplateError (None: it rendered) and its seconds; a failed test when
    it is still going past the budget and the child's start."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", RENDER_IN_A_CHILD],
            input=json.dumps([source, messages, template_kwargs]),
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=MAX_RENDER_S + CHILD_START_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still rendering after {MAX_RENDER_S + CHILD_START_S:g} s: nothing stopped it")
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout)
    return answer["error"], answer["s"]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_template_fails_its_render_quickly_and_clearly(name):
    error, seconds = render_in_a_child(HOSTILE[name], HELLO)
    assert error is not None and error.startswith("chat_template: "), error
    assert "out of memory" not in error  # the budget refused it, not the child's memory bound
    assert seconds < MAX_RENDER_S + 5  # stopped by the budget, on however busy a machine


def test_a_hostile_chat_through_a_real_template_is_bounded(monkeypatch):
    roles = ("user", "assistant")
    huge = [{"role": roles[i % 2], "content": "x" * 100} for i in range(4001)]
    # a real template's work on a long chat fits the allowance per message alone: counted in
    # operations, not timed (a busy machine's clock says nothing about the template)
    monkeypatch.setattr(templates_module, "MAX_OPERATIONS", 0)
    text = template("Qwen-Qwen3-0.6B").render(huge, max_s=60)
    assert text.count("<|im_start|>") == 4002
    monkeypatch.undo()
    both = "{% for m in messages %}{% for n in messages %}{% endfor %}{% endfor %}"
    error, _ = render_in_a_child(both, huge)
    assert error is not None and ("too much work" in error or "took over" in error), error


def test_a_chats_own_odd_content_is_data_to_the_template():
    t = template("Qwen-Qwen2.5-7B-Instruct")
    text = t.render([{"role": "user", "content": "{{ raise_exception('no') }}{% for %}"}])
    assert "{{ raise_exception('no') }}{% for %}" in text
    with pytest.raises(ValueError, match="is not JSON data"):
        t.render([{"role": "user", "content": object()}])


def test_the_thread_renders_again_after_a_failure():
    with pytest.raises(ChatTemplateError):
        ChatTemplate(HOSTILE["deep-recursion"]).render(HELLO)
    assert "Hello" in template("google-gemma-3-4b-it").render(HELLO)
