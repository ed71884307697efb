"""Tool calls on a GGUF whose chat template shows no call format (issue 50): the embedded model
with tests/data/templates/no-tool-marks.jinja written in (an Alpaca-style template that ignores
`tools` and knows only system, user and assistant, in turn), served with nothing set but its
path. It gets the `generic` format: the tools described in a system message, the reply read for
a JSON call. Forced, named and `auto` calls come back valid through the openai, ollama and
anthropic packages; `auto` is really offered (the prompt the engine computed holds the tools'
descriptions); a round trip with the call and its result in the history renders (the template
refuses a `tool` role and two user turns in a row)."""

from __future__ import annotations

import json

import anthropic
import ollama
import openai
import pytest

from localserve.config import Config, ModelConfig, ServerConfig
from localserve.serve.prompt import GENERIC_TOOLS_INTRO, render_chat
from tests.support.paths import ROOT, templated_gguf

pytestmark = pytest.mark.model

NAME = "plain-instruct"
TEMPLATE = ROOT / "tests" / "data" / "templates" / "no-tool-marks.jinja"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def served():
    from localserve.serve.serving import serving

    model = ModelConfig(
        path=str(templated_gguf(TEMPLATE)), n_ctx=2048, n_threads=2, host_cache_mib=0,
        disk_cache_mib=0,
    )  # fmt: skip
    config = Config(default=NAME, models={NAME: model}, server=ServerConfig(shutdown_grace_s=2))
    with serving(config, thread=True) as served:
        yield served


def check_city(arguments: str | dict) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert set(args) == {"city"} and isinstance(args["city"], str) and len(args["city"]) <= 30


def openai_client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.thread.http + "/v1", api_key="-", max_retries=0,
                         timeout=180)  # fmt: skip


def test_the_model_gets_the_generic_format_and_auto_offers_the_tools(served):
    assert served.server.pool.slot(NAME).formats.tool == "generic"
    c = openai_client(served)
    reply = c.chat.completions.create(
        model=NAME, messages=QUESTION, tools=[WEATHER], max_tokens=8, temperature=0
    )
    runner = served.server.runner
    chat = [(m["role"], m["content"]) for m in QUESTION]
    shown = render_chat(chat, "template", runner.apply_chat_template, tools=[WEATHER],
                        describe_tools=True).text  # fmt: skip
    assert GENERIC_TOOLS_INTRO in shown and "The current weather in a city" in shown
    assert reply.usage.prompt_tokens == len(runner.tokenize(shown))  # the text, and its BOS


def test_forced_and_named_calls_through_openai(served):
    c = openai_client(served)
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        reply = c.chat.completions.create(
            model=NAME, messages=QUESTION, tools=[WEATHER], tool_choice=choice, max_tokens=40
        )
        assert reply.choices[0].finish_reason == "tool_calls", reply
        [call] = reply.choices[0].message.tool_calls
        assert call.function.name == "get_weather"
        check_city(call.function.arguments)
    history = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
    ]
    answer = c.chat.completions.create(
        model=NAME, messages=history, tools=[WEATHER], max_tokens=8, temperature=0
    )
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")


TOOL = {  # Anthropic's shape of WEATHER
    "name": "get_weather",
    "description": WEATHER["function"]["description"],
    "input_schema": WEATHER["function"]["parameters"],
}


def test_anthropic_any_and_named_calls(served):
    c = anthropic.Anthropic(base_url=served.thread.http, api_key="-", max_retries=0, timeout=180)
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        reply = c.messages.create(
            model=NAME, max_tokens=40, messages=QUESTION, tools=[TOOL], tool_choice=choice
        )
        uses = [b for b in reply.content if b.type == "tool_use"]
        assert reply.stop_reason == "tool_use" and len(uses) == 1, (choice, reply)
        assert uses[0].name == "get_weather"
        check_city(uses[0].input)


def test_an_auto_call_is_read_through_every_package():
    """The embedded base model does not follow the system message's instructions unforced, so
    an instruction model's `auto` call is scripted on the fake runner, behind the same template:
    the JSON reply is a call for the openai, ollama and anthropic packages alike."""
    from localserve.bench.fake_server import FakeServer
    from tests.support.fakes import ScriptedRunner

    reply = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    pieces = [reply[i : i + 3] for i in range(0, len(reply), 3)]
    source = TEMPLATE.read_text(encoding="utf-8")
    runner = ScriptedRunner(step_s=0.001, reply=pieces, template_source=source)
    server = FakeServer(runner=runner, name=NAME)
    try:
        c = openai.OpenAI(base_url=server.http + "/v1", api_key="-", max_retries=0, timeout=30)
        answer = c.chat.completions.create(model=NAME, messages=QUESTION, tools=[WEATHER])
        [call] = answer.choices[0].message.tool_calls or [None]
        assert call is not None and call.function.name == "get_weather", answer
        check_city(call.function.arguments)
        ask = ollama.Client(host=server.http, timeout=30)
        said = ask.chat(model=NAME, messages=QUESTION, tools=[WEATHER])
        [called] = said.message.tool_calls or [None]
        assert called is not None and called.function.name == "get_weather", said
        check_city(dict(called.function.arguments))
        claude = anthropic.Anthropic(base_url=server.http, api_key="-", max_retries=0)
        message = claude.messages.create(model=NAME, max_tokens=40, messages=QUESTION,
                                         tools=[TOOL])  # fmt: skip
        [use] = [b for b in message.content if b.type == "tool_use"]
        assert message.stop_reason == "tool_use" and use.name == "get_weather"
        check_city(use.input)
    finally:
        server.close()
