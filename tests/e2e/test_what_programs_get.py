"""What the calling program gets from a forced call or a schema'd reply, through the clients
people use, on the embedded base model: exactly one call (or one object) whose arguments
validate against the schema with no key it does not name, at temperatures 0 and 0.8, with
schemas written as frameworks write them (no `additionalProperties`, an unbounded `int`).

Before issue 35 these came back with keys copied from the schema (`{"city": "Paris", "type":
"object"}`), two to eight identical calls, or digits until max_tokens. The full count (13
clients and modes, 20 tries each) is benchmarks/forced_calls_validate.py; this is its sample.
"""

from __future__ import annotations

from typing import Literal

import anthropic
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m"
TRIES = [(0.0, 1), (0.8, 1), (0.8, 2), (0.8, 3)]  # (temperature, seed)


class GetWeather(BaseModel):
    """The current weather in a city."""

    model_config = ConfigDict(extra="forbid")
    city: str
    unit: Literal["celsius", "fahrenheit"]


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=24)  # (bounded: a name that rambles is not what is tested)
    population: int  # unbounded: the base model would write digits until max_tokens
    country: str = Field(max_length=24)


def _schema(model: type[BaseModel]) -> dict:
    """The schema as frameworks send it: no additionalProperties (pydantic's default)."""
    schema = model.model_json_schema()
    schema.pop("additionalProperties", None)
    return schema


WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": _schema(GetWeather)},
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
ABOUT_PARIS = [{"role": "user", "content": "Tell me about Paris as JSON."}]


def openai_client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.http + "/v1", api_key="x", max_retries=0, timeout=180)


NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_a_forced_openai_call_is_one_call_that_validates(live, choice):
    for temperature, seed in TRIES:
        reply = openai_client(live).chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            tools=[WEATHER],
            tool_choice=choice,
            max_tokens=64,
            temperature=temperature,
            seed=seed,
        )
        [call] = reply.choices[0].message.tool_calls  # exactly one
        assert call.function.name == "get_weather"
        GetWeather.model_validate_json(call.function.arguments)  # no key outside the schema
        assert reply.choices[0].finish_reason == "tool_calls"


def test_a_parsed_reply_with_an_unbounded_int_validates(live):
    for temperature, seed in TRIES:
        reply = openai_client(live).chat.completions.parse(
            model=MODEL,
            messages=ABOUT_PARIS,
            response_format=City,
            max_tokens=100,
            temperature=temperature,
            seed=seed,
        )
        assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
        assert isinstance(reply.choices[0].message.parsed, City)
        assert abs(reply.choices[0].message.parsed.population) < 2**53


def test_anthropic_forced_tools_are_one_tool_use_that_validates(live):
    client = anthropic.Anthropic(base_url=live.http, api_key="x", max_retries=0, timeout=180)
    tool = {"name": "get_weather", "input_schema": _schema(GetWeather)}
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        for temperature, _ in TRIES[:2]:
            reply = client.messages.create(
                model=MODEL,
                max_tokens=64,
                messages=QUESTION,
                tools=[tool],
                tool_choice=choice,
                extra_body={"temperature": temperature},
            )
            [use] = [block for block in reply.content if block.type == "tool_use"]
            GetWeather.model_validate(use.input)
            assert reply.stop_reason == "tool_use"


def test_langchain_structured_output_by_function_calling_is_not_none(live):
    for temperature, seed in TRIES[:2]:
        chat = ChatOpenAI(
            base_url=live.http + "/v1",
            api_key="x",
            model=MODEL,
            temperature=temperature,
            max_tokens=64,
            seed=seed,
            max_retries=0,
        )
        city = chat.with_structured_output(City, method="function_calling").invoke(ABOUT_PARIS)
        assert isinstance(city, City)
        message = chat.bind_tools([GetWeather], tool_choice="any").invoke(QUESTION)
        [call] = message.tool_calls
        GetWeather.model_validate(call["args"])
        assert not message.invalid_tool_calls
