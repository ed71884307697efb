"""Structured output against the real model: `response_format` through the `openai` package and
the websocket `chat` frame, constrained by llguidance so the base model's replies validate; a schema
refused with a 400 on `stand_in`, the fake runner under the model's name."""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel, Field

MODEL = "gemma-3-270m"


def client(live, timeout: float = 180) -> openai.OpenAI:
    """Long timeouts: the first constrained request builds the grammar tokenizer (~3 s alone,
    far more on a loaded 2-core machine)."""
    return openai.OpenAI(base_url=live.http + "/v1", api_key="none", max_retries=0, timeout=timeout)


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    population: int = Field(ge=0, le=100_000_000)


PROMPT = "Describe Paris as JSON with name, country and population."


@pytest.mark.model
def test_parse_returns_a_parsed_object_that_validates(live):
    reply = client(live).chat.completions.parse(
        model=MODEL, messages=ask(PROMPT), response_format=City, max_tokens=200, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, City)
    City.model_validate_json(choice.message.content)


@pytest.mark.model
def test_streamed_schema_reply_validates(live):
    with client(live).chat.completions.stream(
        model=MODEL, messages=ask(PROMPT), response_format=City, max_tokens=200, temperature=0.7
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "stop"
    assert isinstance(final.choices[0].message.parsed, City)


@pytest.mark.model
def test_json_object_returns_a_json_object(live):
    reply = client(live).chat.completions.create(
        model=MODEL,
        messages=ask("Give me a JSON object about cats."),
        response_format={"type": "json_object"},
        max_tokens=40,
        temperature=0.5,
        frequency_penalty=0.5,  # llama.cpp's sampler chain: the mask applies there too
    )
    choice = reply.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:  # cut by max_tokens: still a prefix of an object
        assert choice.message.content.lstrip().startswith("{")


def test_an_unsupported_keyword_gets_a_400_naming_it(stand_in):
    bad = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(openai.BadRequestError) as e:
        client(stand_in).chat.completions.create(
            model=MODEL,
            messages=ask("hi"),
            max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": bad}},
        )
    assert e.value.status_code == 400 and "uniqueItems" in str(e.value)


@pytest.mark.model
def test_websocket_chat_with_a_schema_and_a_bad_one(live, connect):
    ws = connect()
    ws.hello("wanda")
    schema = City.model_json_schema()
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
    ws.chat("a", PROMPT, max_tokens=200, response_format=fmt)
    frames = ws.until_done("a")
    text = "".join(f["text"] for f in frames if f["type"] == "token")
    assert frames[-1]["finish_reason"] == "stop", frames[-1]
    City.model_validate_json(text)
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}
    ws.chat("b", PROMPT, max_tokens=8, response_format=bad)
    error = ws.until(lambda f: f["type"] == "error" and f.get("id") == "b")[-1]
    assert error["code"] == "bad_request" and "'not'" in error["message"]
    ws.chat("c", "hi", max_tokens=4)  # the connection goes on
    assert ws.until_done("c")[-1]["type"] == "done"


def test_a_lark_grammar_forces_a_tool_call_with_arguments_per_schema():
    """What tool_choice=required needs: `<tool_call>{json args}</tool_call>` whatever the
    weights, through the public API (ConstraintCompiler.lark -> SamplingParams.constraint),
    on the real model in-process, beside an unconstrained request."""
    from localserve.chat.constraints import ConstraintCompiler
    from localserve.config import ModelConfig
    from localserve.engine.engine import Engine
    from localserve.engine.events import Done, Token
    from localserve.engine.sampling_params import SamplingParams
    from localserve.runners.llama import LlamaRunner
    from localserve.runners.models import ensure_embedded

    args = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
        "x-guidance": {"whitespace_flexible": False},  # else whitespace runs: see chat.tools
    }
    grammar = f'start: "<tool_call>" %json{json.dumps(args)} "</tool_call>"'
    constraint = ConstraintCompiler().compile_sync("lark", grammar)
    cfg = ModelConfig(embedded=True, n_ctx=1024, max_num_seqs=4, max_num_batched_tokens=128)
    runner = LlamaRunner("gemma-3-270m", ensure_embedded(), cfg)
    events: list = []
    try:
        engine = Engine(runner, on_events=events.extend)
        prompt = runner.tokenize("What is the weather in Paris?")
        engine.add_request("call", prompt, SamplingParams(max_tokens=60, constraint=constraint))
        engine.add_request("free", prompt, SamplingParams(max_tokens=10, temperature=0))
        for _ in range(500):
            engine.step()
            if not engine.scheduler.has_work:
                break
    finally:
        runner.close()
    text = "".join(e.text for e in events if isinstance(e, Token) and e.request_id == "call")
    done = {e.request_id: e for e in events if isinstance(e, Done)}
    assert done["call"].finish_reason == "stop", done["call"]
    assert text.startswith("<tool_call>") and text.endswith("</tool_call>"), text
    assert set(json.loads(text[len("<tool_call>") : -len("</tool_call>")])) == {"city"}
    assert done["free"].finish_reason == "length" and done["free"].completion_tokens == 10
