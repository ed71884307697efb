"""OpenAI's Responses API (issue 41) through the real `openai` package, on the real model, on a
server with two users (ann and ben) keeping responses in a state directory of its own.

Text whole and streamed (the event sequence the SDK's `responses.stream()` accumulates), a
forced function call and its `function_call_output` follow-up, `text.format` from a pydantic
model through `responses.parse`, a `previous_response_id` follow-up whose prompt reuses the
previous conversation's cells (cached tokens), another person's id refused as unknown (404) for
create, GET and DELETE, the usage row's `api`, and a 1,000-deep chain refused at once, as cheaply
as an unknown id, while another person's requests go on at their pace.
"""

from __future__ import annotations

import json
import statistics
import threading
import time

import msgspec
import openai
import pytest
from pydantic import BaseModel, Field

from localserve.chat.messages import PromptMessage
from localserve.ops.auth import Access
from localserve.ops.responses_store import StoredResponse
from localserve.serve.responses.create import MAX_CHAIN_DEPTH
from localserve.serve.responses.items import encode_turns
from tests.support.live import LiveServer, live_config
from tests.support.usage import rows_where

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m"
USERS = {"ann": "ann-responses-token", "ben": "ben-responses-token"}
WEATHER = {
    "type": "function",
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
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from localserve.serve.serving import serving

    config = live_config()
    state = str(tmp_path_factory.mktemp("responses-state"))
    config = msgspec.structs.replace(
        config, server=msgspec.structs.replace(config.server, state_dir=state)
    )
    with serving(config, access=Access(USERS), thread=True) as served:
        yield LiveServer(served)


def client(server, user: str = "ann") -> openai.OpenAI:
    """Long timeouts: the first forced call builds the grammar tokenizer (seconds)."""
    return openai.OpenAI(
        base_url=server.http + "/v1", api_key=USERS[user], max_retries=0, timeout=180
    )


# --- text ---------------------------------------------------------------------------------------


def test_a_response_comes_whole_with_its_usage_and_a_usage_row(server):
    r = client(server).responses.create(
        model=MODEL, input="What is the capital of France?", max_output_tokens=24
    )
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert r.status in ("completed", "incomplete") and r.output_text
    message = r.output[0]
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text"
    u = r.usage
    assert u.input_tokens > 0 and 0 < u.output_tokens <= 24
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens >= 0
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens" and u.output_tokens == 24
    (row,) = rows_where(server.server.usage, r.id)
    assert row.api == "responses" and row.user == "ann"
    assert row.prompt_tokens == u.input_tokens and row.completion_tokens == u.output_tokens


def test_a_streamed_response_is_the_event_sequence_the_sdk_accumulates(server):
    c = client(server)
    with c.responses.stream(
        model=MODEL, input="Say hello.", max_output_tokens=400, temperature=0
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()  # only after response.completed
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ], kinds[:6]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ], kinds[-6:]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and all(e.logprobs == [] and e.output_index == 0 for e in deltas)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in deltas)
    assert final.output_text == text and final.status == "completed"
    assert final.usage.output_tokens > 0
    assert c.responses.retrieve(final.id).output_text == text  # stored as it was streamed


# --- tools --------------------------------------------------------------------------------------


def test_a_forced_call_and_its_output_are_answered(server):
    c = client(server)
    r = c.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=80,
    )
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id and call.status == "completed"
    args = json.loads(call.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}
    follow = c.responses.create(
        model=MODEL, previous_response_id=r.id, input=[answer], tools=[WEATHER],
        max_output_tokens=16, temperature=0,  # greedy: a sampled reply may be blank
    )  # fmt: skip
    assert follow.output_text and follow.previous_response_id == r.id
    # the same without the store: the previous output sent back as input
    stateless = c.responses.create(
        model=MODEL, store=False, tools=[WEATHER], max_output_tokens=16, temperature=0,
        input=[{"role": "user", "content": "What is the weather in Paris?"}, *r.output, answer],
    )  # fmt: skip
    assert stateless.output_text and stateless.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(stateless.id)


def test_a_streamed_forced_call_sends_its_arguments(server):
    events = list(
        client(server).responses.create(
            model=MODEL,
            input="What is the weather in Paris?",
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=80,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds, kinds
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(deltas) == done.arguments
    assert set(json.loads(done.arguments)) == {"city", "unit"}
    final = events[-1]
    assert final.type == "response.completed"
    assert [i.type for i in final.response.output] == ["function_call"]


# --- structured output ---------------------------------------------------------------------------


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)


def test_parse_gives_the_pydantic_model(server):
    r = client(server).responses.parse(
        model=MODEL, input="Name a city in France.", text_format=City, max_output_tokens=60
    )
    assert r.status == "completed", r.output
    assert isinstance(r.output_parsed, City) and r.output_parsed.name


# --- kept per person -----------------------------------------------------------------------------


def test_a_follow_up_reuses_the_previous_conversations_cells(server):
    c = client(server)
    first = c.responses.create(
        model=MODEL,
        instructions="You answer briefly.",
        input="Tell me about the sea.",
        max_output_tokens=24,
        temperature=0,
    )
    follow = c.responses.create(
        model=MODEL,
        instructions="You answer briefly.",
        previous_response_id=first.id,
        input="And the mountains?",
        max_output_tokens=8,
    )
    u = follow.usage
    # the whole previous prompt (and most of its reply) came from the cache
    assert u.input_tokens_details.cached_tokens >= first.usage.input_tokens, (first.usage, u)
    assert u.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    (row,) = rows_where(server.server.usage, follow.id)
    assert row.cached_tokens == u.input_tokens_details.cached_tokens


def test_another_persons_response_is_not_found_for_anything(server):
    ann, ben = client(server, "ann"), client(server, "ben")
    r = ann.responses.create(model=MODEL, input="A secret: 42.", max_output_tokens=4)
    with pytest.raises(openai.NotFoundError) as refused:
        ben.responses.create(model=MODEL, previous_response_id=r.id, input="What was it?")
    assert refused.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        ben.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        ben.responses.delete(r.id)
    assert ann.responses.retrieve(r.id).output_text == r.output_text  # ben's delete did nothing
    ann.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        ann.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        ann.responses.create(model=MODEL, previous_response_id=r.id, input="And?")


def test_unsupported_fields_are_refused_naming_them(server):
    c = client(server)
    cases = [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"background": True}, "background"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"extra_body": {"frobnicate": 1}}, None),
    ]
    for fields, param in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            c.responses.create(model=MODEL, input="hi", **fields)
        error = refused.value.body
        if param is not None:
            assert error["param"] == param, error
        else:
            assert "frobnicate" in error["message"], error


# --- hostile: a chain 1,000 deep -----------------------------------------------------------------


def plant_chain(server, user: str, depth: int) -> str:
    """A chain of `depth` stored responses of `user`, written into the server's store, each a
    question and an answer of about 300 characters (a prompt of them all is far past the
    context: unbounded, each request would render and tokenize it before it is refused)."""
    store = server.server.responses
    question = PromptMessage("user", "Tell me more about the sea and its tides, please. " * 3)
    turns = encode_turns([question, PromptMessage("assistant", "The sea is deep and wide. " * 6)])
    previous = None

    async def plant():
        nonlocal previous
        for d in range(1, depth + 1):
            id = f"resp_planted{d}"
            stored = StoredResponse(id=id, model=MODEL, previous=previous, depth=d, body=b"{}",
                                    chain_bytes=d * len(turns), turns=turns,
                                    input=b"[]")  # fmt: skip
            await store.put(user, stored)
            previous = id
        return previous

    return server.call(plant(), timeout=120)


def refusal_seconds(ann: openai.OpenAI, previous: str, refused) -> float:
    """How long ann's request continuing `previous` took to be refused (`refused`: the SDK's
    exception)."""
    started = time.monotonic()
    with pytest.raises(refused):
        ann.responses.create(model=MODEL, previous_response_id=previous, input="More.")
    return time.monotonic() - started


def ben_waits_while_refused(server, previous: str, refused) -> float:
    """The median seconds ben's cheap requests (GET /v1/models) took while 4 threads of ann's
    send `previous` as fast as they are refused (`refused`: the SDK's exception): 25 of
    them, and on until 20 refusals came meanwhile."""
    ann, ben = client(server, "ann"), client(server, "ben")
    stop, refusals = threading.Event(), []

    def attack():
        while not stop.is_set():
            refusal_seconds(ann, previous, refused)
            refusals.append(1)

    attackers = [threading.Thread(target=attack) for _ in range(4)]
    for t in attackers:
        t.start()
    waits, deadline = [], time.monotonic() + 60
    try:
        while len(waits) < 25 or (len(refusals) < 20 and time.monotonic() < deadline):
            started = time.monotonic()
            ben.models.list()
            waits.append(time.monotonic() - started)
    finally:
        stop.set()
        for t in attackers:
            t.join(30)
    assert len(refusals) >= 20, len(refusals)
    return statistics.median(waits)


def test_a_chain_a_thousand_deep_is_refused_at_once_and_slows_nobody(server):
    """Refused from the named response's depth, without walking or rendering the chain: it
    costs no more than the cheapest refusal (an unknown id), and slows another person no more
    when sent as fast as it is answered. Both measured interleaved, medians: the machine's
    other load falls on both alike. (Walking the 1,000 rows in SQLite costs ~1.2 ms against a
    ~0.9 ms refusal here; 10 ms of Python on the event loop, 11 ms.)"""
    leaf = plant_chain(server, "ann", 1000)
    ann = client(server, "ann")
    with pytest.raises(openai.BadRequestError) as refused:
        ann.responses.create(model=MODEL, previous_response_id=leaf, input="More.")
    error = refused.value.body
    assert error["code"] == "chain_too_deep" and error["param"] == "previous_response_id"
    assert f"at most {MAX_CHAIN_DEPTH}" in error["message"] and "1000" in error["message"]
    unknown, deep = [], []
    for _ in range(30):
        unknown.append(refusal_seconds(ann, "resp_never_stored", openai.NotFoundError))
        deep.append(refusal_seconds(ann, leaf, openai.BadRequestError))
    unknown_s, deep_s = statistics.median(unknown), statistics.median(deep)
    assert deep_s <= unknown_s * 1.4 + 0.00025, (unknown_s, deep_s)  # no walk of the chain
    unknown, deep = [], []
    for _ in range(2):
        unknown.append(ben_waits_while_refused(server, "resp_never_stored", openai.NotFoundError))
        deep.append(ben_waits_while_refused(server, leaf, openai.BadRequestError))
    assert statistics.mean(deep) <= statistics.mean(unknown) * 1.5 + 0.001, (unknown, deep)


# --- a thinking model's reasoning, scripted ------------------------------------------------------


QWEN3_LIKE = "{% if tools %}<tool_call>{% endif %}<think></think>"  # marks the formats read
REPLY = (
    "<think>The user wants the weather; I should call the tool.</think>"
    "Let me check.<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    "</tool_call>"
)


def test_a_thinking_models_reasoning_is_an_item_the_sdk_streams_and_keeps():
    from localserve.bench.fake_server import FakeServer
    from tests.support.fakes import ScriptedRunner

    pieces = [REPLY[i : i + 3] for i in range(0, len(REPLY), 3)]  # tags split across tokens
    runner = ScriptedRunner(step_s=0.001, reply=pieces, template_source=QWEN3_LIKE)
    fake = FakeServer(runner=runner)
    try:
        c = openai.OpenAI(base_url=fake.http + "/v1", api_key="x", max_retries=0, timeout=30)
        whole = c.responses.create(model="fake", input="Weather in Paris?", tools=[WEATHER])
        assert [i.type for i in whole.output] == ["reasoning", "message", "function_call"]
        assert whole.output[0].content[0].text.startswith("The user wants the weather")
        assert whole.output_text == "Let me check."
        with c.responses.stream(model="fake", input="Weather?", tools=[WEATHER]) as stream:
            kinds = [e.type for e in stream]
            final = stream.get_final_response()
        assert "response.reasoning_text.delta" in kinds and kinds[-1] == "response.completed"
        assert [i.type for i in final.output] == ["reasoning", "message", "function_call"]
        assert json.loads(final.output[2].arguments) == {"city": "Paris", "unit": "celsius"}
        # sent back as input (reasoning items included), as agents do
        follow = c.responses.create(
            model="fake",
            tools=[WEATHER],
            input=[*final.output, {"type": "function_call_output",
                                   "call_id": final.output[2].call_id, "output": "18 C"}],
        )  # fmt: skip
        assert follow.status == "completed"
    finally:
        fake.close()
