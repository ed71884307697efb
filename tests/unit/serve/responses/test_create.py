"""`POST /v1/responses` and the stored responses' routes on a fake Frontdoor (tests/support/
fake_frontdoor.py) with a real store in a temporary directory: the fields refused by name,
hostile sizes, what reaches admission, every refusal as its status, the streamed events in
order with their fields, a whole response, the chain of previous_response_id (the person's
only, bounded in depth), GET and DELETE by the owner, and a client that leaves cancelling.
What needs the model is in tests/e2e/test_responses_api.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from starlette.applications import Starlette

from localserve.config import ServerConfig
from localserve.ops.auth import Access
from localserve.ops.responses_store import DATABASE, ResponseStore, StoredResponse
from localserve.serve import openai, responses
from localserve.serve.responses.create import MAX_CHAIN_DEPTH
from localserve.serve.responses.items import encode_turns
from localserve.serve.responses.reply import ResponseReply
from tests.support.asgi import HttpExchange, call, wait_for
from tests.support.fake_frontdoor import HERMES_THINKING, FakeFrontdoor, FakeModel

PATH = "/v1/responses"
DATA = Path(__file__).parents[3] / "data"
KEYS = {"ann": "ann-key", "ben": "ben-key"}
WEATHER = {"type": "function", "name": "weather", "parameters": {"type": "object"}}


@pytest.fixture
def store(tmp_path):
    made = ResponseStore(tmp_path / DATABASE, max_count=1000, max_bytes=1 << 20)
    yield made
    made.close()


def app_of(door: FakeFrontdoor, store: ResponseStore | None = None) -> Starlette:
    """The Responses API alone, mounted as serve/app.py mounts it."""
    return Starlette(
        routes=responses.routes(door, store), exception_handlers=openai.exception_handlers()
    )


def as_(user: str) -> dict:
    return {"authorization": f"Bearer {KEYS[user]}"}


def error_of(exchange: HttpExchange) -> dict:
    body = exchange.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def events_of(exchange: HttpExchange) -> list[dict]:
    """The stream's events; each an `event:` line naming its data's type, a `data:` line."""
    text = exchange.body.decode()
    out = []
    for block in text.split("\n\n")[:-1]:
        if block.startswith(":"):  # a waiting note
            continue
        head, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        out.append(event)
    return out


# --- the body, checked before admission ----------------------------------------------------


@pytest.mark.parametrize(
    "fields, param, code",
    [
        ({"background": True}, "background", "unsupported"),
        ({"conversation": "conv_1"}, "conversation", "unsupported"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt", "unsupported"),
        ({"include": ["reasoning.encrypted_content"]}, "include", "unsupported"),
        ({"top_logprobs": 2}, "top_logprobs", "unsupported"),
        ({"max_tool_calls": 3}, "max_tool_calls", "unsupported"),
        ({"service_tier": "flex"}, "service_tier", "unsupported"),
        ({"truncation": "sometimes"}, "truncation", "invalid_value"),
        ({"reasoning": {"budget": 3}}, "reasoning.budget", "unsupported"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported"),
        ({"tools": [{"type": "file_search"}]}, "tools[0].type", "unsupported"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type", "unsupported"),
        ({"tools": [{"type": "computer_use_preview"}]}, "tools[0].type", "unsupported"),
        ({"tools": [WEATHER | {"cache": 1}]}, "tools[0].cache", "unsupported"),
        ({"tools": [{"type": "function", "name": "a b"}]}, "tools[0].name", "invalid_value"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice", "unsupported"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type", "invalid_value"),
        ({"text": {"format": {"type": "json_schema"}}}, "text.format.schema", "invalid_value"),
        ({"text": {"color": "red"}}, "text.color", "unsupported"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type", "unsupported"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "unsupported"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0]",
            "unsupported",
        ),
        ({"input": [{"role": "wizard", "content": "hi"}]}, "input[0].role", "invalid_value"),
        ({"input": [3]}, "input[0]", "invalid_value"),
        ({"input": None}, "input", "invalid_value"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c1", "output": "4"}]},
            "input[0].call_id",
            "invalid_value",
        ),
        (
            {
                "input": [
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "[1]"}
                ]
            },  # fmt: skip
            "input[0].arguments",
            "invalid_value",
        ),
        ({"metadata": {str(i): "x" for i in range(17)}}, "metadata", "invalid_value"),
        ({"temperature": "hot"}, "temperature", "invalid_value"),
        ({"model": "gpt-4o"}, "model", "model_not_found"),
    ],
)
def test_a_bad_or_unsupported_field_is_refused_naming_it_and_nothing_is_submitted(
    fields, param, code
):
    door = FakeFrontdoor()
    answer = call(app_of(door), "POST", PATH, {"input": "hi"} | fields)
    error = error_of(answer)
    assert answer.status == (404 if code == "model_not_found" else 400), error
    assert (error["param"], error["code"]) == (param, code), error
    assert door.submitted == []


def test_an_unknown_field_is_refused_naming_it():
    answer = call(app_of(FakeFrontdoor()), "POST", PATH, {"input": "hi", "frobnicate": 1})
    assert answer.status == 400 and "frobnicate" in error_of(answer)["message"]


def test_hostile_sizes_are_refused_before_admission():
    door = FakeFrontdoor(ServerConfig(max_frame_bytes=1 << 20))
    app = app_of(door)
    many = call(app, "POST", PATH, {"input": [{"role": "user", "content": "x"}] * 5000})
    assert many.status == 400 and error_of(many)["param"] == "input"
    long_id = [{"type": "function_call", "call_id": "c" * 300, "name": "f"}]
    assert error_of(call(app, "POST", PATH, {"input": long_id}))["param"] == "input[0].call_id"
    previous = call(app, "POST", PATH, {"input": "hi", "previous_response_id": "r" * 10_000})
    assert previous.status == 400  # no store here: the field is refused as such
    huge = call(app_of(FakeFrontdoor(ServerConfig(max_frame_bytes=4096))), "POST", PATH,
                {"input": "x" * 5000})  # fmt: skip
    assert huge.status == 413
    deep = call(app, "POST", PATH, b'{"input": ' + b"[" * 2000 + b"]" * 2000 + b"}")
    assert deep.status == 400
    assert door.submitted == []


# --- what reaches admission ------------------------------------------------------------------


def test_input_instructions_and_sampling_reach_admission_as_a_chat():
    door = FakeFrontdoor(ServerConfig(default_max_tokens=64))
    door.script("Paris")
    body = {
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Answer in English."},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "Capital of "}, {"type": "input_text",
                                                                         "text": "France?"}]},
        ],
        "temperature": 0.5,
        "top_p": 0.9,
        "max_output_tokens": 9,
        "user": "ann",
    }  # fmt: skip
    answer = call(app_of(door), "POST", PATH, body)
    assert answer.status == 200, answer.body
    fields = door.fields_of(1)
    assert door.user_of(1) == "ann"
    assert (fields.temperature, fields.top_p, fields.max_tokens) == (0.5, 0.9, 9)
    kind, messages, _, _ = door.prompts.asked[0]
    assert kind == "chat"
    assert [(m.role, m.content) for m in messages] == [
        ("system", "Be brief."),
        ("system", "Answer in English."),
        ("user", "Capital of France?"),
    ]


def test_a_call_and_its_output_are_one_assistant_message_and_a_tool_answer():
    door = FakeFrontdoor(models={"tiny": FakeModel(formats=HERMES_THINKING)})
    door.script("Sunny.")
    body = {
        "tools": [WEATHER],
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "weather",
             "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
        ],
    }  # fmt: skip
    answer = call(app_of(door), "POST", PATH, body)
    assert answer.status == 200, answer.body
    _, messages, _, extras = door.prompts.asked[0]
    assert [m.role for m in messages] == ["user", "assistant", "tool"]
    assert messages[1].tool_calls[0] == ("c1", "weather", '{"city": "Paris"}')
    assert (messages[2].tool_call_id, messages[2].name) == ("c1", "weather")
    assert extras.tools[0]["function"]["name"] == "weather"  # shown in chat completions' shape


def test_openai_agents_requests_replayed_are_served_as_one_assistant_turn():
    """The bodies openai-agents 0.24 sent (scripts/try_openai_agents.py recorded them): our
    reply's items `[function_call, message]` come back in that order with the call's output,
    which the old rule refused (a call answered only right after the message that made it)."""
    bodies = json.loads((DATA / "openai_agents_requests.json").read_text())
    door = FakeFrontdoor(models={"tiny": FakeModel(formats=HERMES_THINKING)})
    for body in bodies:
        door.script("Sunny.")
        answer = call(app_of(door), "POST", PATH, body | {"model": "tiny"})
        assert answer.status == 200, answer.body
    _, messages, _, _ = door.prompts.asked[-1]
    call_item = bodies[-1]["input"][1]
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[2].content == " Let me look that up for you."
    assert messages[2].tool_calls == ((call_item["call_id"], "get_weather", '{"city": "Paris"}'),)
    assert messages[3].tool_call_id == call_item["call_id"]


def item(kind: str, **fields) -> dict:
    if kind == "text":
        return {"type": "message", "role": "assistant", "content": fields["text"]}
    if kind == "call":
        return {"type": "function_call", "call_id": fields["id"], "name": "weather",
                "arguments": "{}"}  # fmt: skip
    if kind == "output":
        return {"type": "function_call_output", "call_id": fields["id"], "output": "18 C"}
    return {"type": "reasoning", "id": "rs_1", "summary": []}


@pytest.mark.parametrize(
    "turn",
    [
        ["text", "call", "call2"],
        ["call", "text", "call2"],
        ["call", "call2", "text"],
        ["reasoning", "call", "reasoning", "text", "call2"],
        ["call", "reasoning", "text", "reasoning", "call2"],
    ],
)
def test_an_assistant_turn_is_its_calls_and_text_in_any_order(turn):
    """Calls, the text beside them and reasoning items, in any order, are one assistant message
    whose calls the outputs after it answer (either one first)."""
    items = [{"role": "user", "content": "Weather in Paris and Rome?"}]
    for kind in turn:
        if kind == "call2":
            items.append(item("call", id="c2"))
        else:
            items.append(item(kind, id="c1", text="Let me check."))
    items += [item("output", id="c2"), item("output", id="c1")]
    door = FakeFrontdoor(models={"tiny": FakeModel(formats=HERMES_THINKING)})
    door.script("Sunny.")
    answer = call(app_of(door), "POST", PATH, {"tools": [WEATHER], "input": items})
    assert answer.status == 200, answer.body
    _, messages, _, _ = door.prompts.asked[0]
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool"]
    assert messages[1].content == "Let me check."
    assert [c.id for c in messages[1].tool_calls] == ["c1", "c2"]


def test_two_assistant_messages_without_a_call_stay_two_and_an_answer_needs_its_turn():
    door = FakeFrontdoor(models={"tiny": FakeModel(formats=HERMES_THINKING)})
    door.script("Sunny.")
    two = [{"role": "user", "content": "Hi"}, item("text", text="Hello."), item("text", text="Hi!")]
    assert call(app_of(door), "POST", PATH, {"input": two}).status == 200
    _, messages, _, _ = door.prompts.asked[0]
    assert [m.content for m in messages] == ["Hi", "Hello.", "Hi!"]
    late = [{"role": "user", "content": "Hi"}, item("call", id="c1"), item("output", id="c1"),
            item("text", text="Done."), item("output", id="c1")]  # fmt: skip
    error = error_of(call(app_of(door), "POST", PATH, {"tools": [WEATHER], "input": late}))
    assert error["param"] == "input[4].call_id", error


def test_a_forced_call_gets_its_grammar_and_text_format_its_constraint():
    door = FakeFrontdoor(models={"tiny": FakeModel(formats=HERMES_THINKING)})
    door.script('<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>')
    forced = {"input": "Weather?", "tools": [WEATHER],
              "tool_choice": {"type": "function", "name": "weather"}}  # fmt: skip
    body = call(app_of(door), "POST", PATH, forced).json()
    assert door.constraint_of(1) is not None
    [item] = body["output"]
    assert item["type"] == "function_call" and item["name"] == "weather"
    assert item["arguments"] == '{"city": "Paris"}' and item["call_id"]
    both = forced | {"text": {"format": {"type": "json_object"}}}
    assert error_of(call(app_of(door), "POST", PATH, both))["param"] == "tool_choice"
    plain = FakeFrontdoor()
    plain.script('{"a": 1}')
    schema = {"type": "json_schema", "name": "A", "strict": True,
              "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}  # fmt: skip
    answer = call(app_of(plain), "POST", PATH, {"input": "JSON", "text": {"format": schema}})
    assert answer.status == 200 and plain.constraint_of(1) is not None
    assert answer.json()["text"] == {"format": schema}


@pytest.mark.parametrize(
    "code, status, retry_after",
    [
        ("busy", 429, "1"),
        ("quota_exceeded", 429, "1"),
        ("shutting_down", 503, "1"),
        ("unavailable", 503, "5"),
        ("bad_request", 400, None),
    ],
)
def test_each_refusal_is_its_status(code, status, retry_after):
    door = FakeFrontdoor()
    door.refuse_next(code, "temperature: no", {"1": 0.3, "5": 5}.get(retry_after, 0))
    answer = call(app_of(door), "POST", PATH, {"input": "hi"})
    assert answer.status == status and answer.headers.get("retry-after") == retry_after


def test_a_prompt_too_long_names_the_input():
    door = FakeFrontdoor()
    door.prompts.too_long = 5000
    error = error_of(call(app_of(door), "POST", PATH, {"input": "hi"}))
    assert (error["code"], error["param"]) == ("context_length_exceeded", "input")


# --- replies -----------------------------------------------------------------------------------


def test_a_whole_response_has_its_items_usage_and_echoed_fields(store):
    door = FakeFrontdoor(access=Access(KEYS))
    door.script("The", " capital", prompt_tokens=9, cached_tokens=4)
    answer = call(app_of(door, store), "POST", PATH,
                  {"input": "hi", "metadata": {"k": "v"}}, as_("ann"))  # fmt: skip
    body = answer.json()
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["status"] == "completed" and body["error"] is None and body["store"] is True
    [message] = body["output"]
    assert message["type"] == "message" and message["id"].startswith("msg_")
    assert message["content"] == [{"type": "output_text", "text": "The capital",
                                   "annotations": [], "logprobs": []}]  # fmt: skip
    assert body["usage"] == {
        "input_tokens": 9,
        "input_tokens_details": {"cached_tokens": 4},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 11,
    }
    assert body["metadata"] == {"k": "v"} and body["tools"] == [] and body["model"] == "tiny"
    assert ResponseReply.api == "responses"  # the usage record's name of this front door


def test_a_reply_cut_by_max_output_tokens_is_incomplete():
    door = FakeFrontdoor()
    door.script("The", finish_reason="length")
    body = call(app_of(door), "POST", PATH, {"input": "hi", "max_output_tokens": 1}).json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"


def test_a_stream_is_the_sdks_event_sequence_with_numbers_and_ids():
    door = FakeFrontdoor(models={"tiny": FakeModel(formats=HERMES_THINKING)})
    door.script("<think>Hm", ".</think>", "Par", "is",
                '<tool_call>{"name": "weather", "arguments": {}}</tool_call>')  # fmt: skip
    body = {"input": "hi", "stream": True, "tools": [WEATHER]}
    events = events_of(call(app_of(door), "POST", PATH, body))
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",  # the reasoning
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # the message
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # the call
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ], kinds
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    created, completed = events[0]["response"], events[-1]["response"]
    assert created["status"] == "in_progress" and created["output"] == []
    assert completed["id"] == created["id"] and completed["status"] == "completed"
    reasoning, message, function = completed["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Hm."}]
    assert message["content"][0]["text"] == "Paris"
    assert function["type"] == "function_call" and function["arguments"] == "{}"
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert all(e["item_id"] == message["id"] and e["output_index"] == 1 for e in deltas)
    assert all(e["content_index"] == 0 and e["logprobs"] == [] for e in deltas)
    done = next(e for e in events if e["type"] == "response.output_item.done")
    assert done["item"] == reasoning


def test_a_stream_the_engine_fails_ends_with_response_failed():
    async def scenario():
        door = FakeFrontdoor()
        stream = HttpExchange(app_of(door), "POST", PATH, {"input": "hi", "stream": True})
        stream.start()
        request = await door.admitted()
        door.token(request, "The")
        await wait_for(lambda: len(stream.chunks) >= 2)
        door.finish(request, "error", error="boom")
        await stream.finished()
        return stream

    events = events_of(asyncio.run(scenario()))
    failed = events[-1]
    assert failed["type"] == "response.failed"
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "server_error"
    assert "boom" in failed["response"]["error"]["message"]


def test_a_client_that_leaves_its_stream_cancels_the_request():
    async def scenario():
        door = FakeFrontdoor()
        stream = HttpExchange(app_of(door), "POST", PATH, {"input": "hi", "stream": True})
        stream.start()
        request = await door.admitted()
        door.token(request, "The")
        await wait_for(lambda: len(stream.chunks) >= 2)
        stream.leave()
        await wait_for(lambda: door.cancelled, what="the request cancelled")
        await stream.finished()
        assert door.cancelled == [request] and not door.in_flight

    asyncio.run(scenario())


# --- kept per person ---------------------------------------------------------------------------


def test_a_follow_up_starts_with_the_previous_turns_and_the_store_keeps_it(store):
    door = FakeFrontdoor(access=Access(KEYS))
    app = app_of(door, store)
    door.script("Paris.")
    first = call(app, "POST", PATH, {"input": "Capital of France?", "instructions": "Brief."},
                 as_("ann")).json()  # fmt: skip
    door.script("Berlin.")
    follow = call(app, "POST", PATH, {"input": "And Germany?", "instructions": "Brief.",
                                      "previous_response_id": first["id"]}, as_("ann"))  # fmt: skip
    assert follow.json()["previous_response_id"] == first["id"]
    _, messages, _, _ = door.prompts.asked[1]
    assert [(m.role, m.content) for m in messages] == [
        ("system", "Brief."),
        ("user", "Capital of France?"),
        ("assistant", "Paris."),
        ("user", "And Germany?"),
    ]
    got = call(app, "GET", f"{PATH}/{first['id']}", headers=as_("ann"))
    assert got.json() == first
    items = call(app, "GET", f"{PATH}/{first['id']}/input_items", headers=as_("ann")).json()
    assert items["object"] == "list" and items["data"][0]["content"] == "Capital of France?"


def test_another_persons_id_is_not_found_for_create_get_and_delete(store):
    door = FakeFrontdoor(access=Access(KEYS))
    app = app_of(door, store)
    door.script("42")
    first = call(app, "POST", PATH, {"input": "secret"}, as_("ann")).json()
    path = f"{PATH}/{first['id']}"
    follow = call(app, "POST", PATH, {"input": "?", "previous_response_id": first["id"]},
                  as_("ben"))  # fmt: skip
    assert follow.status == 404 and error_of(follow)["param"] == "previous_response_id"
    assert call(app, "GET", path, headers=as_("ben")).status == 404
    assert call(app, "DELETE", path, headers=as_("ben")).status == 404
    assert call(app, "GET", path, headers=as_("ann")).status == 200  # still there
    deleted = call(app, "DELETE", path, headers=as_("ann"))
    assert deleted.json() == {"id": first["id"], "object": "response", "deleted": True}
    assert call(app, "GET", path, headers=as_("ann")).status == 404
    assert call(app, "GET", path).status == 401  # nobody's key: not even asked
    assert len(door.submitted) == 1


def test_store_false_keeps_nothing(store):
    door = FakeFrontdoor()
    door.script("hi")
    body = call(app_of(door, store), "POST", PATH, {"input": "hi", "store": False}).json()
    assert body["store"] is False
    assert call(app_of(door, store), "GET", f"{PATH}/{body['id']}").status == 404


def test_a_chain_past_the_bound_is_refused_naming_it_and_nothing_is_submitted(store):
    async def plant():
        previous = None
        for d in range(1, MAX_CHAIN_DEPTH + 1):
            await store.put("api", StoredResponse(id=f"r{d}", model="tiny", previous=previous,
                                                  depth=d, chain_bytes=2 * d, body=b"{}",
                                                  turns=encode_turns([]),
                                                  input=b"[]"))  # fmt: skip
            previous = f"r{d}"

    asyncio.run(plant())
    door = FakeFrontdoor()
    door.script("ok")
    deepest = {"input": "hi", "previous_response_id": f"r{MAX_CHAIN_DEPTH - 1}"}
    last_fits = call(app_of(door, store), "POST", PATH, deepest)
    assert last_fits.status == 200
    answer = call(app_of(door, store), "POST", PATH,
                  {"input": "hi", "previous_response_id": f"r{MAX_CHAIN_DEPTH}"})  # fmt: skip
    error = error_of(answer)
    assert answer.status == 400 and error["code"] == "chain_too_deep"
    assert error["param"] == "previous_response_id"
    assert f"at most {MAX_CHAIN_DEPTH}" in error["message"]
    assert len(door.submitted) == 1


def test_a_chain_past_a_bodys_bytes_is_refused_naming_the_bound(store):
    door = FakeFrontdoor(ServerConfig(max_frame_bytes=4096))
    door.script("ok")
    first = call(app_of(door, store), "POST", PATH, {"input": "x" * 3000}).json()
    door.script("ok")
    second = call(app_of(door, store), "POST", PATH,
                  {"input": "y" * 3000, "previous_response_id": first["id"]})  # fmt: skip
    assert second.status == 200
    answer = call(app_of(door, store), "POST", PATH,
                  {"input": "z", "previous_response_id": second.json()["id"]})  # fmt: skip
    error = error_of(answer)
    assert answer.status == 400 and error["code"] == "chain_too_large", error
    assert "4096" in error["message"] and error["param"] == "previous_response_id"
    assert len(door.submitted) == 2


def test_behind_a_trusted_front_end_the_person_owns_the_response(store):
    config = ServerConfig(trusted_frontends=["webui"])
    door = FakeFrontdoor(config, Access({"webui": "webui-key"}))
    app = app_of(door, store)

    def person(name: str) -> dict:
        return {"authorization": "Bearer webui-key", "x-localserve-user": name}

    door.script("ok")
    made = call(app, "POST", PATH, {"input": "hi"}, person("Bob")).json()
    assert door.user_of(1) == "webui/bob"
    path = f"{PATH}/{made['id']}"
    assert call(app, "GET", path, headers=person("Bob")).status == 200
    assert call(app, "GET", path, headers=person("Eve")).status == 404  # the same key
    follow = call(app, "POST", PATH, {"input": "?", "previous_response_id": made["id"]},
                  person("Eve"))  # fmt: skip
    assert follow.status == 404


def test_a_web_pages_preflight_for_delete_is_answered_with_the_routes_methods(store):
    from localserve.serve.cors import Cors

    origin = "https://app.example"
    app = Cors(app_of(FakeFrontdoor(), store), lambda: [origin], ("/v1",))
    asked = {"origin": origin, "access-control-request-method": "DELETE"}
    answer = call(app, "OPTIONS", f"{PATH}/resp_1", headers=asked)
    assert answer.status == 200, answer.body
    allowed = answer.headers["access-control-allow-methods"]
    assert "DELETE" in allowed and "GET" in allowed
