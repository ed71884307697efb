"""Tool calling and reasoning through the real `openai` package and the websocket protocol.

With the embedded model (a base model, shown tools in the transcript's Hermes form) the calls
are forced (`tool_choice` "required" or a named function), so they are deterministic whatever
the weights: their arguments parse and validate against the tool's schema, whole and streamed,
and the follow-up carrying the call and its result is answered. What a model writes unforced
(`auto`), and its reasoning, are scripted on the fake runner: the reply is read for them.
Histories of calls OpenAI's API refuses get their 400 (their error frame) naming the field.
"""

from __future__ import annotations

import json

import openai
import pytest

from localserve.bench.blocking_ws import WS
from localserve.bench.fake_server import FakeServer
from tests.support.fakes import ScriptedRunner

MODEL = "gemma-3-270m"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def client(server, timeout: float = 180) -> openai.OpenAI:
    """Long timeouts: the first forced call builds the grammar tokenizer (seconds)."""
    return openai.OpenAI(base_url=server.http + "/v1", api_key="x", max_retries=0, timeout=timeout)


def check_weather_arguments(arguments: str) -> dict:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit"} and isinstance(args["city"], str), args
    assert args["unit"] in ("celsius", "fahrenheit") and len(args["city"]) <= 30
    return args


# --- forced calls on the real model -------------------------------------------------------------


@pytest.mark.model
def test_a_required_call_comes_back_whole_with_valid_arguments(live):
    reply = client(live).chat.completions.create(
        model=MODEL, messages=QUESTION, tools=[WEATHER], tool_choice="required", max_tokens=80
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls  # a forced reply is one call (docs/protocol.md)
    assert len(calls) == 1, calls
    call = calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert call.id.startswith("call_")
    check_weather_arguments(call.function.arguments)
    assert choice.message.content is None


@pytest.mark.model
def test_a_named_call_streams_by_index_and_its_result_is_answered(live):
    c = client(live)
    stream = c.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        max_tokens=80,
        stream=True,
    )
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta, finish = chunk.choices[0].delta, chunk.choices[0].finish_reason or finish
        for part in delta.tool_calls or ():
            call = calls.setdefault(part.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = part.id or call["id"]
            call["name"] = (part.function.name if part.function else None) or call["name"]
            call["arguments"] += (part.function.arguments or "") if part.function else ""
    assert finish == "tool_calls" and list(calls) == [0]
    call = calls[0]
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    args = check_weather_arguments(call["arguments"])
    history = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(args)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call["id"], "content": '{"temperature": 21}'},
    ]
    answer = c.chat.completions.create(
        model=MODEL, messages=history, tools=[WEATHER], max_tokens=80, temperature=0
    )
    assert answer.choices[0].finish_reason in ("stop", "tool_calls"), answer
    assert answer.usage.prompt_tokens > 60  # the tools, the call and its result were shown
    # the reply ends where the transcript's next line would start (without those stops this
    # model wrote '\nTool: {"temperature": 21}' after its call, a result nobody gave it)
    content = answer.choices[0].message.content or ""
    assert not any(f"{who}:" in content for who in ("Tool", "User", "Assistant")), content


@pytest.mark.model
def test_a_forced_call_over_the_websocket(live):
    ws = WS(live.url)
    ws.hello("tess")
    ws.chat("t1", "What is the weather in Paris?", max_tokens=80, tools=[WEATHER],
            tool_choice="required", parallel_tool_calls=False)  # fmt: skip
    done = ws.until_done("t1", timeout=180)[-1]
    assert done["finish_reason"] == "tool_calls", done
    [call] = done["tool_calls"]
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    check_weather_arguments(call["arguments"])
    ws.close()


def test_bad_tool_fields_are_refused_naming_them(stand_in):
    c = client(stand_in)
    cases = {
        "tools[0].function.name": {"tools": [{"type": "function", "function": {"name": "a b"}}]},
        "tool_choice": {"tools": [WEATHER], "tool_choice": "sometimes"},
        "messages[1].tool_call_id": {
            "messages": [*QUESTION, {"role": "tool", "content": "21 degrees"}],
        },
        "chat_template_kwargs": {"extra_body": {"chat_template_kwargs": {"a b": 1}}},
    }
    for param, fields in cases.items():
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(**({"model": MODEL, "messages": QUESTION} | fields))
        assert e.value.param == param, (param, e.value.body)


# --- what a model writes unforced, scripted -----------------------------------------------------


def scripted(reply: str, template: str) -> FakeServer:
    pieces = [reply[i : i + 3] for i in range(0, len(reply), 3)]  # tags split across tokens
    runner = ScriptedRunner(step_s=0.001, reply=pieces, template_source=template)
    return FakeServer(runner=runner)


QWEN3_LIKE = "{% if tools %}<tool_call>{% endif %}<think></think>"  # marks the formats read
REPLY = (
    "<think>The user wants the weather; I should call the tool.</think>"
    "Let me check.<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    "</tool_call>"
)


def test_an_auto_call_and_the_reasoning_are_read_out_of_the_reply():
    server = scripted(REPLY, QWEN3_LIKE)
    try:
        c = client(server, timeout=30)
        reply = c.chat.completions.create(model="fake", messages=QUESTION, tools=[WEATHER])
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls"
        assert message.content == "Let me check."
        assert message.model_extra["reasoning_content"].startswith("The user wants the weather")
        [call] = message.tool_calls
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
        stream = c.chat.completions.create(
            model="fake", messages=QUESTION, tools=[WEATHER], stream=True
        )
        content = reasoning = arguments = ""
        finish = None
        for chunk in stream:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            for part in delta.tool_calls or ():
                arguments += part.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        assert (content, finish) == ("Let me check.", "tool_calls")
        assert reasoning == message.model_extra["reasoning_content"]
        assert json.loads(arguments) == {"city": "Paris", "unit": "celsius"}
    finally:
        server.close()


def test_without_tools_the_call_is_text_and_the_reasoning_still_split():
    server = scripted(REPLY, QWEN3_LIKE)
    try:
        reply = client(server, timeout=30).chat.completions.create(model="fake", messages=QUESTION)
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "stop" and not message.tool_calls
        assert message.content.startswith("Let me check.<tool_call>")
        assert "reasoning_content" in message.model_extra
    finally:
        server.close()


def test_the_websocket_streams_reasoning_apart_and_ends_with_the_calls():
    server = scripted(REPLY, QWEN3_LIKE)
    try:
        ws = WS(server.url)
        ws.hello("ria")
        ws.chat("r1", "weather?", max_tokens=200, tools=[WEATHER])
        frames = ws.until_done("r1", timeout=30)
        text = "".join(f.get("text", "") for f in frames if f["type"] == "token")
        reasoning = "".join(f.get("reasoning", "") for f in frames if f["type"] == "token")
        done = frames[-1]
        assert text == "Let me check." and reasoning.startswith("The user wants the weather")
        assert done["finish_reason"] == "tool_calls"
        assert [c["name"] for c in done["tool_calls"]] == ["get_weather"]
        ws.close()
    finally:
        server.close()


GENERIC_CALL = (
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n```'
)


def test_a_model_whose_template_shows_no_call_format_is_told_the_tools_and_read_for_json():
    """The `generic` format: the tools are described in the prompt (it grows by them), and a
    JSON call the model wrote (in a ```json block here) is a call, whatever order its keys."""
    server = scripted(GENERIC_CALL, "no formats here")
    try:
        c = client(server, timeout=30)
        plain = c.chat.completions.create(model="fake", messages=QUESTION, max_tokens=4)
        reply = c.chat.completions.create(model="fake", messages=QUESTION, tools=[WEATHER])
        assert reply.choices[0].finish_reason == "tool_calls", reply
        [call] = reply.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and not reply.choices[0].message.content
        assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
        assert reply.usage.prompt_tokens > plain.usage.prompt_tokens + 40  # the tools, shown
    finally:
        server.close()


def _call(city: str, key_order: tuple[str, str] = ("city", "unit")) -> str:
    arguments = {key: {"city": city, "unit": "celsius"}[key] for key in key_order}
    call = json.dumps({"name": "get_weather", "arguments": arguments})
    return f"<tool_call>\n{call}\n</tool_call>"


# Paris, Paris again (its keys in another order: the same call), then Rome
THREE_CALLS = _call("Paris") + _call("Paris", ("unit", "city")) + _call("Rome")


def _streamed_calls(stream) -> dict[int, tuple[str, str]]:
    calls: dict[int, list[str]] = {}
    for chunk in stream:
        for part in chunk.choices[0].delta.tool_calls or ():
            name, arguments = calls.setdefault(part.index, ["", ""])
            calls[part.index] = [name + (part.function.name or ""), arguments]
            calls[part.index][1] += part.function.arguments or ""
    return {i: (name, json.loads(arguments)["city"]) for i, (name, arguments) in calls.items()}


def test_a_repeated_call_is_kept_once_and_the_calls_are_numbered_in_order():
    server = scripted(THREE_CALLS, QWEN3_LIKE)
    try:
        c = client(server, timeout=30)
        reply = c.chat.completions.create(model="fake", messages=QUESTION, tools=[WEATHER])
        calls = reply.choices[0].message.tool_calls
        assert [json.loads(call.function.arguments)["city"] for call in calls] == ["Paris", "Rome"]
        assert len({call.id for call in calls}) == 2
        stream = c.chat.completions.create(
            model="fake", messages=QUESTION, tools=[WEATHER], stream=True
        )
        assert _streamed_calls(stream) == {0: ("get_weather", "Paris"), 1: ("get_weather", "Rome")}
        ws = WS(server.url)
        ws.hello("ria")
        ws.chat("r1", "weather?", max_tokens=400, tools=[WEATHER])
        done = ws.until_done("r1", timeout=30)[-1]
        assert [json.loads(call["arguments"])["city"] for call in done["tool_calls"]] == [
            "Paris",
            "Rome",
        ]
        ws.close()
    finally:
        server.close()


def test_without_parallel_tool_calls_an_auto_reply_keeps_its_first_call():
    server = scripted(THREE_CALLS, QWEN3_LIKE)
    try:
        c = client(server, timeout=30)
        one = dict(model="fake", messages=QUESTION, tools=[WEATHER], parallel_tool_calls=False)
        reply = c.chat.completions.create(**one)
        [call] = reply.choices[0].message.tool_calls
        assert json.loads(call.function.arguments)["city"] == "Paris"
        assert reply.choices[0].finish_reason == "tool_calls"
        assert _streamed_calls(c.chat.completions.create(**one, stream=True)) == {
            0: ("get_weather", "Paris")
        }
        ws = WS(server.url)
        ws.hello("ria")
        ws.chat("r1", "weather?", max_tokens=400, tools=[WEATHER], parallel_tool_calls=False)
        done = ws.until_done("r1", timeout=30)[-1]
        assert [json.loads(call["arguments"])["city"] for call in done["tool_calls"]] == ["Paris"]
        ws.close()
    finally:
        server.close()


# --- histories of calls OpenAI refuses ----------------------------------------------------------


def made(*ids: str, arguments: str = '{"city": "Paris", "unit": "celsius"}') -> dict:
    """An assistant message that made calls, as the openai package sends it back."""
    calls = [
        {"id": i, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        for i in ids
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def answered(call_id: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": '{"temperature": 21}'}


# each history OpenAI's API refuses, and the field its 400 names
MALFORMED = [
    ("messages[2].tool_call_id", [*QUESTION, made("call_a"), answered("call_b")]),  # unknown id
    ("messages[1].tool_call_id", [*QUESTION, answered("call_a")]),  # no call before it
    ("messages[4].tool_call_id", [*QUESTION, made("call_a"), answered("call_a"),
                                  made("call_b"), answered("call_a")]),  # an earlier message's
    ("messages[3].tool_call_id", [*QUESTION, made("call_a"), *QUESTION, answered("call_a")]),
    ("messages[3].tool_call_id", [*QUESTION, made("call_a"), answered("call_a"),
                                  answered("call_a")]),  # answered twice
    ("messages[1].tool_calls[0].function.arguments", [*QUESTION,
                                                      made("call_a", arguments="Paris")]),
    ("messages[1].tool_calls[1].id", [*QUESTION, made("call_a", "call_a")]),
]  # fmt: skip


def test_malformed_histories_of_calls_are_refused_naming_the_message_and_field(fake):
    c = client(fake, timeout=30)
    for param, messages in MALFORMED:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="fake", messages=messages, max_tokens=2)
        assert e.value.param == param and e.value.code == "invalid_value", e.value.body
        assert e.value.body["message"].startswith(param + ": "), e.value.body
    history = [*QUESTION, made("call_a", "call_b"), answered("call_b"), answered("call_a")]
    reply = c.chat.completions.create(model="fake", messages=history, max_tokens=2)
    assert reply.choices[0].finish_reason == "length"


def as_frame(message: dict) -> dict:
    """An OpenAI message as the websocket chat frame's: its calls {"id", "name", "arguments"}."""
    calls = [{"id": c["id"], **c["function"]} for c in message.get("tool_calls", [])]
    plain = {k: v for k, v in message.items() if k != "tool_calls" and v is not None}
    return plain | ({"tool_calls": calls} if calls else {})


def test_the_websocket_refuses_them_too_as_its_frame_names_the_fields(fake):
    ws = WS(fake.url)
    ws.hello("hal")
    for param, messages in MALFORMED:
        frame = {"type": "chat", "id": "h", "messages": [as_frame(m) for m in messages]}
        ws.send(frame | {"max_tokens": 2})
        error = ws.recv()
        where = param.replace(".function.", ".")
        assert error["code"] == "bad_request" and error["message"].startswith(where + ": "), error
        assert error["id"] == "h"
    history = [*QUESTION, made("call_a", "call_b"), answered("call_b"), answered("call_a")]
    ws.send({"type": "chat", "id": "h", "messages": [as_frame(m) for m in history]})
    assert ws.until_done("h")[-1]["finish_reason"] in ("stop", "length")
    ws.close()
