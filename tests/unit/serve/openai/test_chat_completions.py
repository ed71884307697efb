"""`POST /v1/chat/completions` on a fake Frontdoor (tests/support/fake_frontdoor.py): the body's
checks and their 400s, what reaches admission, every refusal as OpenAI's status and error, the
per-user caps, the SSE frames of a stream and the body of a whole reply, and a client that
leaves cancelling its request. It drives the OpenAI routes (serve/openai/__init__.py) and the
reply (serve/openai/reply.py, errors.py, validation.py) in memory, in milliseconds; what needs
the model stays in tests/e2e/test_openai_api.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.applications import Starlette

from localserve.config import ServerConfig
from localserve.ops.auth import Access
from localserve.serve import openai
from tests.support.asgi import HttpExchange, call, wait_for
from tests.support.fake_frontdoor import HERMES_THINKING, FakeFrontdoor, FakeModel

PATH = "/v1/chat/completions"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def app_of(door: FakeFrontdoor) -> Starlette:
    """The OpenAI API alone, mounted as serve/app.py mounts it."""
    return Starlette(routes=openai.routes(door), exception_handlers=openai.exception_handlers())


def error_of(exchange: HttpExchange) -> dict:
    body = exchange.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def sse(exchange: HttpExchange) -> list:
    """The stream's events, decoded ("[DONE]" as it is); every event a `data:` line and a blank."""
    text = exchange.body.decode()
    assert text.endswith("\n\n"), text[-80:]
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events[:3]
    return [e[6:] if e == "data: [DONE]" else json.loads(e[6:]) for e in events]


# --- the body, checked before admission -------------------------------------------------------


@pytest.mark.parametrize(
    "fields, param, code",
    [
        ({"n": 2}, "n", "unsupported"),
        ({"logprobs": True}, "logprobs", "unsupported"),
        ({"logit_bias": {"1": 2.0}}, "logit_bias", "unsupported"),
        ({"functions": [{"name": "f"}]}, "functions", "unsupported"),
        ({"modalities": ["text", "audio"]}, "modalities", "unsupported"),
        ({"prediction": {"type": "content"}}, "prediction", "unsupported"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", "invalid_value"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
            "unsupported",
        ),
        (
            {"messages": [{"role": "tool", "content": "4"}]},
            "messages[0].tool_call_id",
            "invalid_value",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": "x",
                        "tool_calls": [{"id": "c", "function": {"name": "f"}}],
                    }
                ]
            },
            "messages[0].tool_calls",
            "invalid_value",
        ),
        ({"messages": "hi"}, "messages", "invalid_value"),
        ({"temperature": "hot"}, "temperature", "invalid_value"),
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools[0].function.name",
            "invalid_value",
        ),
        ({"chat_template_kwargs": {"not a name": 1}}, "chat_template_kwargs", "invalid_value"),
        ({"user": " padded "}, "user", "invalid_value"),
        ({"model": "gpt-4o"}, "model", "model_not_found"),
    ],
)
def test_a_bad_field_is_a_400_or_404_naming_it_and_nothing_is_submitted(fields, param, code):
    door = FakeFrontdoor()
    answer = call(app_of(door), "POST", PATH, {"messages": ASK} | fields)
    error = error_of(answer)
    assert answer.status == (404 if code == "model_not_found" else 400), error
    assert (error["param"], error["code"]) == (param, code), error
    assert error["type"] == "invalid_request_error"
    assert door.submitted == []


def test_a_tool_answer_must_answer_a_call_of_the_message_before_it():
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "4"}]  # fmt: skip
    answer = call(app_of(FakeFrontdoor()), "POST", PATH, {"messages": history})
    assert answer.status == 400 and error_of(answer)["param"] == "messages[2].tool_call_id"


def test_tools_need_a_call_format_and_a_forced_call_no_response_format():
    plain = call(app_of(FakeFrontdoor()), "POST", PATH, {"messages": ASK, "tools": [WEATHER]})
    assert plain.status == 400 and error_of(plain)["param"] == "tools"
    door = FakeFrontdoor(models={"tiny": FakeModel(formats=HERMES_THINKING)})
    both = {"messages": ASK, "tools": [WEATHER], "tool_choice": "required",
            "response_format": {"type": "json_object"}}  # fmt: skip
    answer = call(app_of(door), "POST", PATH, both)
    assert answer.status == 400 and error_of(answer)["param"] == "tool_choice"
    assert door.submitted == []


def test_a_forced_call_reaches_admission_with_its_grammar_and_its_reply_is_read():
    door = FakeFrontdoor(models={"tiny": FakeModel(formats=HERMES_THINKING)})
    door.script('<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>')
    body = {"messages": ASK, "tools": [WEATHER], "tool_choice": "required"}
    answer = call(app_of(door), "POST", PATH, body)
    assert door.constraint_of(1) is not None  # the call's grammar, compiled
    [choice] = answer.json()["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [made] = choice["message"]["tool_calls"]
    assert made["function"] == {"name": "weather", "arguments": '{"city": "Paris"}'}


def test_hostile_sizes_and_broken_json_are_413_and_400_with_openais_shape():
    door = FakeFrontdoor(ServerConfig(max_frame_bytes=4096))
    app = app_of(door)
    huge = call(app, "POST", PATH, {"messages": [{"role": "user", "content": "x" * 5000}]})
    assert huge.status == 413 and error_of(huge)["code"] == "request_too_large"
    lying = call(app, "POST", PATH, b"{}", {"content-length": "99999999"})
    assert lying.status == 413  # the declared length is enough to refuse it
    deep = call(app, "POST", PATH, b'{"messages": ' + b"[" * 2000 + b"]" * 2000 + b"}")
    assert deep.status == 400 and error_of(deep)["code"] in ("invalid_json", "invalid_value")
    for broken in (b'{"model": ', b"", b"null", b"[1, 2]"):
        answer = call(app, "POST", PATH, broken)
        assert answer.status == 400, broken
        assert error_of(answer)["type"] == "invalid_request_error"
    long_id = [{"role": "tool", "tool_call_id": "x" * 300, "content": "4"}]
    assert error_of(call(app, "POST", PATH, {"messages": long_id}))["code"] == "invalid_value"
    assert door.submitted == []


def test_an_unknown_path_and_a_wrong_method_keep_openais_shape():
    app = app_of(FakeFrontdoor())
    missing = call(app, "POST", "/v1/nothing", {})
    assert missing.status == 404 and error_of(missing)["code"] == "not_found"
    wrong = call(app, "GET", PATH)
    assert wrong.status == 405 and error_of(wrong)["code"] == "method_not_allowed"


# --- what reaches admission ------------------------------------------------------------------


def test_the_chat_reaches_admission_with_its_user_fields_and_messages():
    door = FakeFrontdoor(ServerConfig(default_max_tokens=64))
    door.script("Paris")
    system = {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}
    body = {"messages": [system, *ASK], "temperature": 0.5, "stop": "\n", "user": "ann",
            "top_k": 3}  # fmt: skip
    answer = call(app_of(door), "POST", PATH, body)
    assert answer.status == 200, answer.body
    fields = door.fields_of(1)
    assert door.user_of(1) == "ann" and fields.max_tokens == 64  # the server's default
    assert (fields.temperature, fields.stop, fields.top_k) == (0.5, ["\n"], 3)
    kind, messages, _, _ = door.prompts.asked[0]
    assert kind == "chat" and [m.role for m in messages] == ["system", "user"]
    assert messages[0].content == "Be brief."  # developer counts as system, parts joined
    body["max_completion_tokens"] = 9
    door.script("Paris")
    call(app_of(door), "POST", PATH, body)
    assert door.max_tokens_of(2) == 9


def test_an_open_server_names_the_user_api_unless_the_body_names_one():
    door = FakeFrontdoor()
    door.script("hi")
    call(app_of(door), "POST", PATH, {"messages": ASK})
    assert door.user_of(1) == "api"


def test_a_token_server_names_the_user_by_the_key_and_refuses_a_wrong_one():
    door = FakeFrontdoor(access=Access({"kate": "correct-horse", "liz": "battery-staple"}))
    app = app_of(door)
    door.script("hi")
    key = {"authorization": "Bearer battery-staple"}
    answer = call(app, "POST", PATH, {"messages": ASK, "user": "kate"}, key)
    assert answer.status == 200 and door.user_of(1) == "liz"  # the key names the user
    wrong = call(app, "POST", PATH, {"messages": ASK}, {"authorization": "Bearer guess"})
    assert wrong.status == 401 and error_of(wrong)["code"] == "invalid_api_key"
    assert wrong.headers["www-authenticate"].startswith("Bearer")
    none = call(app, "GET", "/v1/models")
    assert none.status == 401
    door.stage.throttle_s = 4.2
    throttled = call(app, "POST", PATH, {"messages": ASK}, {"authorization": "Bearer guess"})
    assert throttled.status == 429 and throttled.headers["retry-after"] == "5"
    assert error_of(throttled)["type"] == "rate_limit_error"
    assert len(door.submitted) == 1


# --- every refusal as OpenAI says it ------------------------------------------------------------


@pytest.mark.parametrize(
    "code, message, status, error_type, error_code, param, retry_after",
    [
        (
            "busy",
            "8 requests of yours are already in flight",
            429,
            "rate_limit_error",
            "rate_limit_exceeded",
            None,
            "1",
        ),
        (
            "quota_exceeded",
            "your daily quota is used up",
            429,
            "insufficient_quota",
            "insufficient_quota",
            None,
            "3600",
        ),
        (
            "too_long",
            "the prompt has 5000 tokens; the context holds 4096",
            400,
            "invalid_request_error",
            "context_length_exceeded",
            "messages",
            None,
        ),
        (
            "unavailable",
            "the model is unavailable: restarting",
            503,
            "server_error",
            "engine_unavailable",
            None,
            "5",
        ),
        (
            "shutting_down",
            "the server is shutting down",
            503,
            "server_error",
            "shutting_down",
            None,
            "1",
        ),
        (
            "bad_request",
            "temperature: must be at least 0",
            400,
            "invalid_request_error",
            "invalid_value",
            "temperature",
            None,
        ),
        (
            "bad_request",
            "response_format.type: 'yaml' is not one of text, json_object",
            400,
            "invalid_request_error",
            "invalid_value",
            "response_format.type",
            None,
        ),
    ],
)
def test_each_refusal_is_its_status_type_code_and_retry_after(
    code, message, status, error_type, error_code, param, retry_after
):
    door = FakeFrontdoor()
    seconds = {"1": 0.3, "3600": 3599.2, "5": 5}.get(retry_after, 0)
    door.refuse_next(code, message, seconds)
    answer = call(app_of(door), "POST", PATH, {"messages": ASK})
    error = error_of(answer)
    assert answer.status == status, error
    assert (error["type"], error["code"], error["param"]) == (error_type, error_code, param)
    assert error["message"] == message
    assert answer.headers.get("retry-after") == retry_after


def test_a_prompt_too_long_for_the_context_says_both_numbers_on_messages():
    door = FakeFrontdoor()
    door.prompts.too_long = 5000
    error = error_of(call(app_of(door), "POST", PATH, {"messages": ASK}))
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
    assert "5000" in error["message"] and "4096" in error["message"]


def test_the_per_user_cap_is_a_429_for_that_user_only_with_retry_after():
    async def scenario():
        door = FakeFrontdoor(ServerConfig(max_inflight_per_user=1))
        app = app_of(door)
        body = {"messages": ASK, "stream": True, "user": "capped"}
        first = HttpExchange(app, "POST", PATH, body).start()
        held = await door.admitted(1)
        second = await HttpExchange(app, "POST", PATH, body).start().finished()
        assert second.status == 429 and second.headers["retry-after"] == "1"
        assert "in flight" in error_of(second)["message"]
        door.script("ok")
        other = await HttpExchange(app, "POST", PATH, body | {"user": "free"}).start().finished()
        assert other.status == 200  # someone else is not held back
        door.finish(held)
        await first.finished()

    asyncio.run(scenario())


# --- streams ------------------------------------------------------------------------------------


def test_a_stream_is_a_role_delta_each_text_as_written_a_finish_and_done():
    async def scenario():
        door = FakeFrontdoor()
        body = {"messages": ASK, "stream": True}
        stream = HttpExchange(app_of(door), "POST", PATH, body).start()
        request = await door.admitted()
        for n, text in enumerate(["The", " capital", " is Paris"], start=2):
            door.token(request, text)
            await wait_for(lambda n=n: len(stream.chunks) >= n, what=text)
        door.finish(request, "length", prompt_tokens=9, completion_tokens=3)
        await stream.finished()
        return stream

    stream = asyncio.run(scenario())
    assert stream.status == 200
    assert stream.headers["content-type"].startswith("text/event-stream")
    assert stream.headers["x-localserve-dropped-messages"] == "0"
    events = sse(stream)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": "The"},
                      {"content": " capital"}, {"content": " is Paris"}, {}]  # fmt: skip
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 4 + ["length"]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1 and "usage" not in chunks[-1]


def test_a_stream_with_include_usage_ends_with_a_usage_chunk_and_says_unrecorded():
    door = FakeFrontdoor(records_usage=True)
    door.script("Paris", prompt_tokens=9, cached_tokens=4, recorded=False)
    body = {"messages": ASK, "stream": True, "stream_options": {"include_usage": True}}
    chunks = sse(call(app_of(door), "POST", PATH, body))[:-1]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    last = chunks[-1]
    assert last["choices"] == [] and last["recorded"] is False
    assert last["usage"] == {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10,
                             "prompt_tokens_details": {"cached_tokens": 4},
                             "dropped_messages": 0}  # fmt: skip


@pytest.mark.parametrize(
    "finish, error_code, shutting_down, code",
    [
        ("error", "internal", False, "internal_error"),
        ("error", "unavailable", False, "engine_unavailable"),
        ("cancelled", "internal", True, "shutting_down"),
    ],
)
def test_a_stream_the_engine_fails_ends_with_an_error_event_then_done(
    finish, error_code, shutting_down, code
):
    async def scenario():
        door = FakeFrontdoor()
        stream = HttpExchange(app_of(door), "POST", PATH, {"messages": ASK, "stream": True})
        stream.start()
        request = await door.admitted(1)
        door.token(request, "Par")
        await wait_for(lambda: len(stream.chunks) >= 2)
        door.is_shutting_down = shutting_down  # it began after the chat was admitted
        door.finish(request, finish, error="the step failed", error_code=error_code)
        return await stream.finished()

    events = sse(asyncio.run(scenario()))
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == code
    assert events[-3]["choices"][0]["delta"] == {"content": "Par"}


# --- whole replies ------------------------------------------------------------------------------


def test_a_whole_reply_is_one_chat_completion_with_its_usage():
    door = FakeFrontdoor(records_usage=True)
    door.script("The", " capital", prompt_tokens=9, cached_tokens=2)
    answer = call(app_of(door), "POST", PATH, {"messages": ASK})
    body = answer.json()
    assert answer.status == 200 and body["object"] == "chat.completion"
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant",
                                "content": "The capital"}, "logprobs": None,
                                "finish_reason": "stop"}]  # fmt: skip
    assert body["usage"]["total_tokens"] == 11 and body["usage"]["dropped_messages"] == 0
    assert "recorded" not in body  # its row was committed: nothing to say
    assert answer.headers["x-localserve-dropped-messages"] == "0"


@pytest.mark.parametrize(
    "finish, error_code, shutting_down, status, code",
    [
        ("error", "internal", False, 500, "internal_error"),
        ("error", "unavailable", False, 503, "engine_unavailable"),
        ("cancelled", "internal", True, 503, "shutting_down"),
        ("cancelled", "internal", False, 500, "cancelled"),
    ],
)
def test_a_whole_reply_the_engine_failed_is_its_status(
    finish, error_code, shutting_down, status, code
):
    async def scenario():
        door = FakeFrontdoor()
        whole = HttpExchange(app_of(door), "POST", PATH, {"messages": ASK}).start()
        request = await door.admitted(1)
        door.token(request, "Par")
        door.is_shutting_down = shutting_down  # it began after the chat was admitted
        door.finish(request, finish, error="gone", error_code=error_code)
        return await whole.finished()

    answer = asyncio.run(scenario())
    assert answer.status == status and error_of(answer)["code"] == code
    if status == 503:
        assert int(answer.headers["retry-after"]) >= 1


# --- a client that goes away --------------------------------------------------------------------


def test_a_client_that_closes_its_stream_mid_reply_cancels_the_request():
    async def scenario():
        door = FakeFrontdoor()
        stream = HttpExchange(app_of(door), "POST", PATH, {"messages": ASK, "stream": True})
        stream.start()
        request = await door.admitted()
        door.token(request, "The")
        await wait_for(lambda: len(stream.chunks) >= 2)
        stream.leave()
        await wait_for(lambda: door.cancelled, what="the request cancelled")
        await stream.finished()
        assert door.cancelled == [request] and not door.in_flight
        assert not stream.is_complete  # no finish chunk, no [DONE]: nobody reads them

    asyncio.run(scenario())


def test_a_client_that_leaves_before_a_whole_reply_cancels_it():
    async def scenario():
        door = FakeFrontdoor()
        whole = HttpExchange(app_of(door), "POST", PATH, {"messages": ASK}).start()
        request = await door.admitted()
        door.token(request, "The")
        whole.leave()
        await wait_for(lambda: door.cancelled, what="the request cancelled")
        await whole.finished()
        assert door.cancelled == [request] and whole.status is None

    asyncio.run(scenario())


def test_a_client_that_leaves_while_its_prompt_is_built_stops_it_there():
    async def scenario():
        door = FakeFrontdoor()
        door.prompts.gate = asyncio.Event()  # the prompt is being built
        whole = HttpExchange(app_of(door), "POST", PATH, {"messages": ASK}).start()
        await wait_for(lambda: door.prompts.asked, what="the prompt being built")
        whole.leave()
        await wait_for(lambda: door.is_told_to_stop(1), what="told to stop")
        door.prompts.gate.set()
        await whole.finished()
        assert whole.status == 499 and not door.in_flight

    asyncio.run(scenario())


def test_a_stream_nobody_reads_is_cut_off_past_max_outbox_bytes_and_cancelled():
    async def scenario():
        door = FakeFrontdoor()
        limit = door.config.max_outbox_bytes
        stream = HttpExchange(app_of(door), "POST", PATH, {"messages": ASK, "stream": True})
        stream.start()
        request = await door.admitted()
        for _ in range(limit // 1000 + 2):  # all before the reply writes any
            door.token(request, "x" * 1000)
        assert door.cancelled == [request]
        await stream.finished()

    asyncio.run(scenario())


# --- people behind a trusted front-end ----------------------------------------------------------


def test_person_headers_name_someone_only_from_a_trusted_frontends_key():
    config = ServerConfig(trusted_frontends=["webui"])
    door = FakeFrontdoor(config, Access({"kate": "kate-key", "webui": "webui-key"}))
    app = app_of(door)
    person = {"x-localserve-user": "Bob"}
    for key in ("kate-key", "webui-key"):
        door.script("ok")
        headers = {"authorization": f"Bearer {key}"} | person
        assert call(app, "POST", PATH, {"messages": ASK}, headers).status == 200
    assert [door.user_of(1), door.user_of(2)] == ["kate", "webui/bob"]
    twice = [("authorization", "Bearer webui-key")] + [("x-localserve-user", "bob")] * 2
    answer = call(app, "POST", PATH, {"messages": ASK}, twice)
    assert answer.status == 400 and error_of(answer)["param"] == "X-Localserve-User"


# --- what a reply carries beside its text ------------------------------------------------------


def test_a_streamed_call_and_reasoning_come_as_deltas_by_index_with_finish_tool_calls():
    door = FakeFrontdoor(models={"tiny": FakeModel(formats=HERMES_THINKING)})
    reply = ('<think>Weather it is.</think><tool_call>{"name": "weather", "arguments": '
             '{"city": "Paris"}}</tool_call>')  # fmt: skip
    door.script(*(reply[i : i + 7] for i in range(0, len(reply), 7)))
    body = {"messages": ASK, "tools": [WEATHER], "stream": True}
    chunks = sse(call(app_of(door), "POST", PATH, body))[:-1]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Weather it is."
    calls = [c for d in deltas for c in d.get("tool_calls", ())]
    assert calls[0]["index"] == 0 and calls[0]["function"]["name"] == "weather"
    assert calls[0]["id"] and calls[0]["type"] == "function"
    arguments = "".join(c["function"]["arguments"] for c in calls)
    assert json.loads(arguments) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_the_messages_left_out_to_fit_are_in_the_header_and_the_usage():
    door = FakeFrontdoor()
    door.prompts.num_dropped_messages = 2
    door.script("ok")
    answer = call(app_of(door), "POST", PATH, {"messages": ASK})
    assert answer.headers["x-localserve-dropped-messages"] == "2"
    assert answer.json()["usage"]["dropped_messages"] == 2


def test_a_stream_whose_socket_takes_nothing_for_write_timeout_s_is_cancelled():
    async def scenario():
        door = FakeFrontdoor(ServerConfig(write_timeout_s=0.05))
        stream = HttpExchange(app_of(door), "POST", PATH, {"messages": ASK, "stream": True})
        stream.start()
        request = await door.admitted()
        await wait_for(lambda: stream.chunks, what="the role chunk")
        stream.stall()
        door.token(request, "The")
        await wait_for(lambda: door.cancelled, what="the request cancelled")
        assert door.cancelled == [request]

    asyncio.run(scenario())


def test_a_waiting_stream_hears_its_place_and_predicted_wait_in_comments_sse_clients_skip():
    async def scenario():
        door = FakeFrontdoor()
        stream = HttpExchange(app_of(door), "POST", PATH, {"messages": ASK, "stream": True}).start()
        request = await door.admitted()
        door.queued(request, 3, 12.04)
        await wait_for(lambda: b"position=3" in stream.body, what="the first note")
        door.queued(request, 1, None)
        await wait_for(lambda: b"position=1" in stream.body, what="the second note")
        door.token(request, "Paris")
        door.finish(request)
        await stream.finished()
        return stream.body.decode()

    body = asyncio.run(scenario())
    events = body.split("\n\n")[:-1]
    notes = [e for e in events if e.startswith(":")]
    assert notes == [": queued position=3 wait_s=12.0", ": queued position=1"]
    data = [json.loads(e[6:]) for e in events if e.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in data) == "Paris"
