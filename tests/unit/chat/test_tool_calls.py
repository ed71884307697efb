"""Tool-call parsing: every format whole and a character at a time, any split the same as whole,
parallel calls, content around them, malformed and unfinished calls as text, unicode."""

from __future__ import annotations

import itertools
import json
import time
from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localserve.chat.tool_calls import (
    FORMATS,
    PARSERS,
    ContentDelta,
    ToolCallArguments,
    ToolCallStart,
    choose_tool_format,
    detect_tool_format,
    new_tool_parser,
)
from localserve.chat.tool_calls.mistral import new_mistral_call_id
from localserve.chat.tool_calls.pythonic import pythonic_calls
from localserve.chat.tool_calls.scanning import json_value_end
from localserve.config import ConfigError, ModelConfig, ToolFormat, parse_config


def parse(fmt: str, pieces, **options):
    """(content, [(name, arguments as a dict)], events) of a reply fed as `pieces`."""
    ids = itertools.count()
    parser = new_tool_parser(fmt, new_id=lambda: f"id{next(ids)}", **options)
    events = [e for piece in pieces for e in parser.feed(piece)]
    finished = parser.finish()
    events += finished.events
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls = [(c.name, json.loads(c.arguments)) for c in finished.calls]
    return content, calls, events


def text_of(events) -> str:
    return "".join(e.text for e in events if isinstance(e, ContentDelta))


def whole(fmt, text, **options):
    return parse(fmt, [text], **options)[:2]


def by_char(fmt, text, **options):
    return parse(fmt, list(text), **options)[:2]


WEATHER = {"city": "Paris", "unit": "celsius"}

# (format, reply, content, calls): the formats as their families write them
CASES = [
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
        "\n</tool_call>",
        "",
        [("get_weather", WEATHER)],
    ),
    (
        "hermes",
        'Let me check both.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
        '"Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": '
        '"Europe/Paris"}}\n</tool_call>',
        "Let me check both.\n\n",
        [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})],
    ),
    (
        "hermes",  # Qwen writes arguments as a string now and then; no closing tag at the end
        '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n',
        "",
        [("f", {"x": 1})],
    ),
    (
        "llama3",
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        "",
        [("get_weather", WEATHER)],
    ),
    (
        "llama3",
        '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}',
        "",
        [("a", {"x": 1}), ("b", {})],
    ),
    (
        "llama3",
        'I will look it up. <|python_tag|>{"type": "function", "name": "a", "parameters": {}}',
        "I will look it up. ",
        [("a", {})],
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},'
        ' {"name": "get_time", "arguments": {}}]',
        "",
        [("get_weather", WEATHER), ("get_time", {})],
    ),
    (
        "mistral",
        'Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}'
        '[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{"tz": "UTC"}',
        "Checking.",
        [("get_weather", WEATHER), ("get_time", {"tz": "UTC"})],
    ),
    (
        "gemma",
        'I will check.\n```tool_code\nget_weather(city="Paris", unit="celsius")\n```',
        "I will check.\n",
        [("get_weather", WEATHER)],
    ),
    (
        "gemma",
        "```tool_code\n[get_weather(city='Paris'), get_time(tz=None, hours=(1, 2), ok=True)]\n```"
        "\nThen I will answer.",
        "\nThen I will answer.",
        [
            ("get_weather", {"city": "Paris"}),
            ("get_time", {"tz": None, "hours": [1, 2], "ok": True}),
        ],
    ),
    (
        "gemma",  # the Python list Google's function-calling prompt asks for
        "[get_weather(city='Paris', unit=\"celsius\"), get_time(tz='Asia/Tōkyō, \\'JST]\\'')]",
        "",
        [("get_weather", WEATHER), ("get_time", {"tz": "Asia/Tōkyō, 'JST]'"})],
    ),
    (
        "gemma",
        '  {"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        "",
        [("get_weather", WEATHER)],
    ),
]


DS_CALL = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{}\n```json\n{}\n```<｜tool▁call▁end｜>"
CASES += [
    (
        "generic",
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
        "",
        [("get_weather", WEATHER)],
    ),
    (
        "generic",  # one line per call, as the system message asks; `parameters` read too
        '\n{"name": "a", "arguments": {"x": 1}}\n{"name": "b", "parameters": {}}\nDone.',
        "\nDone.",
        [("a", {"x": 1}), ("b", {})],
    ),
    (
        "generic",  # an instruction model's habit: the JSON in a fenced block
        '```json\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n```'
        "\nI asked for the weather.",
        "\nI asked for the weather.",
        [("get_weather", WEATHER)],
    ),
    (
        "generic",
        "The weather is sunny, and {braces} in text are text.",
        "The weather is sunny, and {braces} in text are text.",
        [],
    ),
]
CASES += [
    (
        "deepseek",
        "I'll check.\n\n<｜tool▁calls▁begin｜>"
        + DS_CALL.format("get_weather", json.dumps(WEATHER))
        + "\n"
        + DS_CALL.format("get_time", "{}")
        + "<｜tool▁calls▁end｜>",
        "I'll check.\n\n",
        [("get_weather", WEATHER), ("get_time", {})],
    ),
]


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES)
def test_each_format_whole_and_a_character_at_a_time(fmt, text, content, calls):
    assert whole(fmt, text) == (content, calls)
    assert by_char(fmt, text) == (content, calls)


def test_events_stream_a_call_as_openai_does():
    text = 'Hi <tool_call>{"name": "f", "arguments": {"a": [1, 2]}}</tool_call>'
    _, _, events = parse("hermes", [text[:8], text[8:30], text[30:]])
    assert events == [
        ContentDelta("Hi "),
        ToolCallStart(0, "id0", "f"),
        ToolCallArguments(0, '{"a": [1, 2]}'),
    ]


def test_the_call_comes_out_once_it_is_whole_and_content_is_held_only_while_unclear():
    parser = new_tool_parser("hermes")
    assert parser.feed("Sure <tool") == [ContentDelta("Sure ")]
    assert parser.feed("_call>\n{") == []
    assert parser.feed('"name": "f"}') == []
    assert [type(e) for e in parser.feed("\n</tool_call>")] == [ToolCallStart, ToolCallArguments]
    assert parser.feed(" <tools are fun") == [ContentDelta(" <tools are fun")]
    assert parser.finish().events == []


def test_malformed_or_unfinished_generic_calls_are_text():
    for text in (
        '{"name": "f", "arguments": {"x": 1}',  # unfinished
        '```json\n{"name": "f", "arguments": {}}',  # no closing fence
        '```json\n{"name": "f", "arguments": {}}\nand more```',
        '```json\n{"a": 1}\n```',  # JSON, not a call
        '{"name": "f", "arguments": [1]}',
        'Sure: {"name": "f", "arguments": {}}',  # not opening the reply
        "```json\n```",
    ):
        assert whole("generic", text) == (text, []), text
        assert by_char("generic", text) == (text, []), text


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("hermes", '<tool_call>\n{"name": "f", "arguments": {"x": '),  # unfinished
        ("hermes", '<tool_call>\n{"name": "f", "arguments": {"x": tru}}\n</tool_call>'),  # bad JSON
        ("hermes", '<tool_call>\n{"function": "f", "args": {}}\n</tool_call>'),  # unknown shape
        ("hermes", '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>'),
        ("hermes", '<tool_call>{"name": "f"} and more</tool_call>'),
        ("hermes", '\n\n <tool_call>{"name": "f", oops}</tool_call>\n'),  # its whitespace kept
        ("llama3", '{"name": "f", "parameters": {"x": 1}'),
        ("llama3", '{"answer": 42}'),
        ("llama3", "<|python_tag|>brave_search.call(query='weather')"),
        ("mistral", "[TOOL_CALLS]"),
        ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"oops": 1}]'),
        ("mistral", "[TOOL_CALLS]get_weather[ARG"),
        ("mistral", '[TOOL_CALLS]get_weather{"city": "Paris"}'),
        ("mistral", "[TOOL_CALLS]get_weather[ARGS]not json"),
        ("gemma", "```tool_code\nget_weather(city='Paris')"),  # no closing fence
        ("gemma", "```tool_code\nimport os; os.system('rm -rf /')\n```"),
        ("gemma", "```tool_code\nget_weather('Paris')\n```"),  # positional: names unknown
        ("gemma", "```tool_code\nf(x=open('/etc/passwd'))\n```"),  # not a literal: never run
        ("gemma", "```tool_code\nf(x={1, 2})\n```"),  # a set is not JSON
        ("gemma", "```tool_code\n```"),
        ("gemma", "```tool_codex\nf()\n```"),
        ("gemma", "[a link](https://example.org) opening the reply"),
        ("gemma", "[1, 2, 3] are numbers"),
        ("gemma", "[get_weather(city='Paris')"),
        (
            "deepseek",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{",
        ),
        ("deepseek", "<｜tool▁calls▁begin｜>plain text<｜tool▁calls▁end｜>"),
        (
            "deepseek",
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n[1]\n```<｜tool▁call▁end｜>",
        ),
        (
            "deepseek",
            "<｜tool▁call▁begin｜>code<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜>",
        ),
    ],
)
def test_malformed_or_unfinished_calls_are_text(fmt, text):
    assert whole(fmt, text) == (text, [])
    assert by_char(fmt, text) == (text, [])


def test_text_after_a_malformed_call_is_still_read():
    text = '<tool_call>{"name": oops}</tool_call> then <tool_call>{"name": "g"}</tool_call>'
    assert whole("hermes", text) == ('<tool_call>{"name": oops}</tool_call> then ', [("g", {})])


def test_a_json_reply_is_a_call_only_when_it_opens_the_reply():
    text = 'Here: {"name": "f", "parameters": {}}'
    assert whole("llama3", text) == (text, [])
    assert whole("gemma", text) == (text, [])


def test_a_reply_opening_with_a_bracket_is_held_only_while_it_may_be_a_call():
    gemma = new_tool_parser("gemma")
    assert gemma.feed("[get_wea") == []
    assert gemma.feed("ther") == []
    assert text_of(gemma.feed(" is what I would call")) == "[get_weather is what I would call"
    assert text_of(new_tool_parser("gemma").feed("[Note: long")) == "[Note: long"
    assert text_of(new_tool_parser("llama3").feed("{ 1")) == "{ 1"
    assert new_tool_parser("llama3").feed('{"na') == []


def test_whitespace_between_calls_is_dropped_and_other_text_kept():
    text = '<tool_call>{"name": "a"}</tool_call>\n\n  <tool_call>{"name": "b"}</tool_call>\n\nok\n'
    assert whole("hermes", text) == ("\n\nok\n", [("a", {}), ("b", {})])
    assert by_char("hermes", text) == ("\n\nok\n", [("a", {}), ("b", {})])


def test_unicode_names_arguments_and_content():
    text = (
        "Je vérifie 🌦️… <tool_call>\n"
        '{"name": "météo", "arguments": {"ville": "Zürich", "note": "雨 \\u00e9 🌧"}}\n</tool_call>'
    )
    content, calls = whole("hermes", text)
    assert content == "Je vérifie 🌦️… "
    assert calls == [("météo", {"ville": "Zürich", "note": "雨 é 🌧"})]
    assert by_char("hermes", text) == (content, calls)
    _, _, events = parse("hermes", [text])
    assert "Zürich" in events[-1].fragment  # the arguments' JSON keeps the characters


def test_what_is_held_is_bounded():
    filler = "x" * 500
    text = f'<tool_call>{{"name": "f", "arguments": {{"x": "{filler}"}}}}</tool_call>'
    assert whole("hermes", text, max_call_chars=200) == (text, [])
    assert by_char("hermes", text, max_call_chars=200) == (text, [])
    parser = new_tool_parser("hermes", max_call_chars=200)
    held_back = 0
    for c in text:
        held_back = max(held_back, len(parser._held))
        parser.feed(c)
    assert held_back <= 201
    assert whole("hermes", text, max_call_chars=600)[1] == [("f", {"x": filler})]


def test_ids_are_openai_style_except_mistral_which_needs_nine_letters():
    parser = new_tool_parser("hermes")
    parser.feed('<tool_call>{"name": "f"}</tool_call>')
    (call,) = parser.finish().calls
    assert call.id.startswith("call_") and len(call.id) == 29 and call.id[5:].isalnum()
    assert len(new_mistral_call_id()) == 9 and new_mistral_call_id().isalnum()
    parser = new_tool_parser("mistral")
    parser.feed("[TOOL_CALLS]f[ARGS]{}")
    (call,) = parser.finish().calls
    assert len(call.id) == 9 and call.id.isalnum()


def test_the_parser_is_used_once():
    parser = new_tool_parser("gemma")
    parser.finish()
    with pytest.raises(ValueError, match="finished"):
        parser.feed("more")
    with pytest.raises(ValueError, match="finished"):
        parser.finish()


def test_pythonic_calls_read_literals_without_running_anything():
    assert pythonic_calls("a.b(x=-1.5, y=[1, {'k': 'v'}])\nc()") == [
        ("a.b", {"x": -1.5, "y": [1, {"k": "v"}]}),
        ("c", {}),
    ]
    assert pythonic_calls("f(**kw)") is None
    assert pythonic_calls("f(x=float('nan'))") is None
    assert pythonic_calls("f(x=" + "[" * 5000 + "]" * 5000 + ")") is None


def test_json_value_end_follows_strings_and_brackets():
    assert json_value_end('{"a": "}]\\"{", "b": [1]} tail', 0) == 24
    assert json_value_end('{"a": [1, 2}', 0) is None


@settings(max_examples=300, deadline=None)
@given(
    text=st.lists(st.sampled_from(["{", "}", "[", "]", '"', "\\", "a", " "]), max_size=40).map(
        "".join
    ),
    cuts=st.lists(st.integers(0, 100), max_size=10),
)
def test_json_value_end_resumed_piece_by_piece_finds_what_one_scan_finds(text, cuts):
    text = "{" + text
    resume: list = []
    for end in sorted({c % (len(text) + 1) for c in cuts}) + [len(text)]:
        got = json_value_end(text[:end], 0, resume)
        if got is not None:
            break
    assert got == json_value_end(text, 0)


def _long_call(fmt: str, lines: int) -> tuple[str, str]:
    code = "x = {'a': [1, \"b\"]}\n" * lines  # brackets, quotes and escapes
    args = json.dumps({"code": code})
    text = {
        "hermes": f'<tool_call>{{"name": "w", "arguments": {args}}}</tool_call>',
        "llama3": f'{{"name": "w", "parameters": {args}}}',
        "mistral": f"[TOOL_CALLS]w[ARGS]{args}",
        "gemma": f"```tool_code\nw(code={code!r})\n```",
        "deepseek": DS_CALL.format("w", args),
        "generic": f'{{"name": "w", "arguments": {args}}}',
    }[fmt]
    return code, text


def _parse_time(fmt: str, lines: int) -> float:
    """CPU seconds to read a call of `lines` lines fed 4 characters at a time (best of three:
    this process's time, not the wall clock, so that other work on the machine does not count)."""
    code, text = _long_call(fmt, lines)
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        content, calls, _ = parse(fmt, [text[i : i + 4] for i in range(0, len(text), 4)])
        best = min(best, time.process_time() - started)
        assert calls == [("w", {"code": code})] and content == ""
    return best


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_long_call_fed_a_token_at_a_time_costs_each_token_only(fmt):
    """Four times the call, about four times the time (scanning it all again at each token
    would be sixteen; ten is the bound): a ratio measured side by side, not a wall-clock bound."""
    small, large = _parse_time(fmt, 1_000), _parse_time(fmt, 4_000)
    assert large < 10 * small, (small, large)


def test_a_deeply_nested_call_is_text_not_a_crash():
    text = '<tool_call>{"name": "f", "arguments": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}"
    text += "</tool_call>"
    assert whole("hermes", text, max_call_chars=1 << 20) == (text, [])


# --- any split of the reply gives what the whole reply gives ---------------------------------

NOISE = ["<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "```tool_code"]
NOISE += ["```json", "```", '{"name": "f", "arguments": {}}']
NOISE += [
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
]
NOISE += ["function", "```json\n", "\n```", "<｜tool▁calls▁end｜>"]
NOISE += ["{", "}", "[", "]", '"', ";", "\n", " ", "f(x=1)", '"name": "f"', "é", "🌧", "<", "`"]


def splits(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(0, 10_000), max_size=40))
def test_any_split_of_a_reply_gives_the_same_as_whole(case, cuts):
    fmt, text, content, calls = case
    assert parse(fmt, splits(text, cuts))[:2] == (content, calls)


@settings(max_examples=400, deadline=None)
@given(
    fmt=st.sampled_from(FORMATS),
    text=st.lists(st.sampled_from(NOISE) | st.text(max_size=3), max_size=30).map("".join),
    cuts=st.lists(st.integers(0, 10_000), max_size=20),
)
def test_any_text_any_split_parses_the_same_and_never_raises(fmt, text, cuts):
    content, calls = whole(fmt, text)
    assert parse(fmt, splits(text, cuts))[:2] == (content, calls)
    if not calls:  # nothing is lost, but a reply that is only whitespace
        assert content == text or (content == "" and not text.strip(" \t\r\n"))


# --- choosing the format ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "fmt"),
    [
        ("{%- if tools %}<tool_call>\\n{{ tool_call | tojson }}</tool_call>{% endif %}", "hermes"),
        ("{{- '[AVAILABLE_TOOLS]' }}{{- '[TOOL_CALLS]' + tool_calls | tojson }}", "mistral"),
        ("{{- '<|start_header_id|>ipython<|end_header_id|>' }}", "llama3"),
        ("{{- '<|python_tag|>' + tool_call.name }}", "llama3"),
        ("{{ '<start_of_turn>' + role + '\\n' }}", "gemma"),
        ("{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'}}", "deepseek"),
        ("{{ message.content }}", None),
        (None, None),
        ("gemma", "gemma"),  # llama.cpp's built-in templates, by name
        ("mistral-v7-tekken", "mistral"),
        ("llama3", "llama3"),
        ("chatml", None),
    ],
)
def test_the_format_is_read_from_the_template(template, fmt):
    """A template that shows none gets the generic format (the tools described in the prompt)."""
    assert detect_tool_format(template) == fmt
    assert choose_tool_format("auto", template) == (fmt or "generic")


def test_a_configured_format_wins_over_the_template():
    assert choose_tool_format("gemma", "<tool_call>") == "gemma"
    with pytest.raises(ValueError, match="unknown tool format"):
        choose_tool_format("json", None)
    with pytest.raises(ValueError, match="unknown tool format"):
        new_tool_parser("json")


def test_every_configurable_format_has_a_parser():
    assert set(PARSERS) == set(get_args(ToolFormat)) == set(FORMATS)
    assert ModelConfig().tool_format == "auto"
    assert ModelConfig(tool_format="mistral").tool_format == "mistral"


def test_models_toml_names_a_bad_tool_format():
    with pytest.raises(ConfigError, match="tool_format"):
        parse_config('[models.m]\npath = "m.gguf"\ntool_format = "json"\n')
