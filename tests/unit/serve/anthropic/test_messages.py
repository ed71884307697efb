"""`POST /v1/messages` and `/v1/messages/count_tokens` on a fake Frontdoor
(tests/support/fake_frontdoor.py): bad bodies as Anthropic's errors naming the field in its
dotted form, what reaches admission, every refusal's status (529 for overloaded), the per-user
caps, the stream's events in order and the whole message, thinking and tool_use blocks, a client
that leaves cancelling its request, and the token count. It drives the Anthropic routes
(serve/anthropic/__init__.py) and serve/anthropic/messages.py, reply.py, blocks.py, errors.py
and validation.py in memory; what needs the model stays in tests/e2e/test_anthropic_api.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.applications import Starlette

from localserve.config import ServerConfig
from localserve.ops.auth import Access
from localserve.serve import anthropic, openai
from tests.support.asgi import HttpExchange, call, wait_for
from tests.support.fake_frontdoor import HERMES_THINKING, FakeFrontdoor, FakeModel

PATH = "/v1/messages"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
BODY = {"model": "tiny", "max_tokens": 50, "messages": ASK}
WEATHER = {"name": "weather", "input_schema": {"type": "object"}}


def app_of(door: FakeFrontdoor) -> Starlette:
    """The Anthropic API alone, mounted as serve/app.py mounts it."""
    return Starlette(
        routes=anthropic.routes(door), exception_handlers=anthropic.exception_handlers({})
    )


def error_of(exchange: HttpExchange) -> tuple[str, str]:
    body = exchange.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return body["error"]["type"], body["error"]["message"]


def events(exchange: HttpExchange) -> list[tuple[str, dict]]:
    """The stream's (event, data) pairs; each an `event:` and a `data:` line, then a blank."""
    text = exchange.body.decode()
    assert text.endswith("\n\n"), text[-80:]
    out = []
    for block in text.split("\n\n")[:-1]:
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), block
        payload = json.loads(data[6:])
        assert payload["type"] == name[7:]
        out.append((name[7:], payload))
    return out


def tool_use(*ids: str) -> dict:
    blocks = [{"type": "tool_use", "id": i, "name": "weather", "input": {}} for i in ids]
    return {"role": "assistant", "content": blocks}


def tool_result(*ids: str) -> dict:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": i} for i in ids]}


# --- the body, checked before admission -------------------------------------------------------


@pytest.mark.parametrize(
    "fields, status, words",
    [
        ({"model": "claude-sonnet-4-5"}, 404, "model: 'claude-sonnet-4-5' not found"),
        ({"max_tokens": 0}, 400, "max_tokens: at least 1"),
        ({"max_tokens": "many"}, 400, "max_tokens: Expected `int`"),
        ({"messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content: "),
        ({"messages": []}, 400, "messages: at least one message"),
        ({"messages": [{"role": "system", "content": "x"}]}, 400, "messages.0.role: "),
        ({"messages": [*ASK, {"role": "assistant", "content": "Par"}]}, 400, "a prefill"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image"}]}]},
            400,
            "messages.0.content.0.type: a content block of type 'image'",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            400,
            "messages.0.content.0.text: required",
        ),
        ({"stop_sequences": [""]}, 400, "stop_sequences: "),
        ({"thinking": {"type": "maybe"}}, 400, "thinking.type: "),
        ({"tools": [{"name": "weather"}]}, 400, "tools.0.input_schema: required"),
        ({"tools": [WEATHER | {"type": "web_search_20250305"}]}, 400, "tools.0.type: "),
        ({"tools": [WEATHER | {"name": "a b"}]}, 400, "tools.0.name: "),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "time"}},
            400,
            "tool_choice.name: 'time' is not one of the tools",
        ),
        ({"tool_choice": {"type": "any"}}, 400, "tool_choice: 'any' needs tools"),
        ({"tool_choice": {"type": "sometimes"}}, 400, "tool_choice.type: "),
    ],
)
def test_a_bad_field_is_anthropics_error_naming_it_dotted_and_nothing_is_submitted(
    fields, status, words
):
    door = FakeFrontdoor(models={"tiny": FakeModel(formats=HERMES_THINKING)})
    answer = call(app_of(door), "POST", PATH, BODY | fields)
    kind, message = error_of(answer)
    assert answer.status == status and words in message, message
    assert kind == ("not_found_error" if status == 404 else "invalid_request_error")
    assert "function" not in message and "[" not in message  # Anthropic's names, not OpenAI's
    assert door.submitted == []


@pytest.mark.parametrize(
    "field, messages",
    [
        ("messages.2.content.0.tool_use_id", [*ASK, tool_use("toolu_a"), tool_result("toolu_b")]),
        ("messages.0.content.0.tool_use_id", [tool_result("toolu_a")]),
        (
            "messages.2.content.1.tool_use_id",
            [*ASK, tool_use("toolu_a"), tool_result("toolu_a", "toolu_a")],
        ),
        (
            "messages.1.content.1.id",
            [*ASK, tool_use("toolu_a", "toolu_a"), tool_result("toolu_a")],
        ),
    ],
)
def test_a_malformed_tool_history_names_the_block_and_field(field, messages):
    door = FakeFrontdoor()
    for path in (PATH, f"{PATH}/count_tokens"):
        answer = call(app_of(door), "POST", path, BODY | {"messages": messages})
        assert answer.status == 400 and error_of(answer)[1].startswith(field + ": ")


def test_hostile_sizes_and_broken_json_are_413_and_400_in_anthropics_shape():
    app = app_of(FakeFrontdoor(ServerConfig(max_frame_bytes=4096)))
    huge = call(app, "POST", PATH, BODY | {"messages": [{"role": "user", "content": "x" * 5000}]})
    assert huge.status == 413 and error_of(huge)[0] == "request_too_large"
    blocks = [{"type": "text", "text": "x"}] * 4097
    many = call(
        app_of(FakeFrontdoor()),
        "POST",
        PATH,
        BODY | {"messages": [{"role": "user", "content": blocks}]},
    )
    assert many.status == 400 and "at most 4096 content blocks" in error_of(many)[1]
    for broken in (b"{", b"", b"null", b'{"model": "tiny"}'):
        answer = call(app, "POST", PATH, broken)
        assert answer.status == 400 and error_of(answer)[0] == "invalid_request_error", broken
    assert call(app, "GET", PATH).status == 405
    assert error_of(call(app, "POST", f"{PATH}/batches", {}))[0] == "not_found_error"


# --- what reaches admission ------------------------------------------------------------------


def test_the_message_reaches_admission_with_its_fields_system_and_tool_results():
    door = FakeFrontdoor(ServerConfig(max_tokens=40), models={"tiny": FakeModel(HERMES_THINKING)})
    door.script("Sunny.")
    history = [*ASK, tool_use("toolu_a"),
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a",
                                             "content": "rain", "is_error": True}]}]  # fmt: skip
    body = BODY | {"system": [{"type": "text", "text": "Be brief."}], "messages": history,
                   "max_tokens": 1000, "temperature": 0.3, "stop_sequences": ["\n"],
                   "tools": [WEATHER], "thinking": {"type": "disabled"}}  # fmt: skip
    assert call(app_of(door), "POST", PATH, body).status == 200
    fields = door.fields_of(1)
    assert (fields.max_tokens, fields.temperature, fields.stop) == (40, 0.3, ["\n"])  # capped
    assert door.user_of(1) == "anthropic"
    _, messages, _, extras = door.prompts.asked[0]
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[3].content == "Error: rain" and messages[3].name == "weather"
    assert extras.template_kwargs == {"enable_thinking": False} and extras.tools


def test_a_token_server_takes_x_api_key_or_a_bearer_and_refuses_others():
    door = FakeFrontdoor(access=Access({"kate": "correct-horse"}))
    app = app_of(door)
    missing = call(app, "POST", PATH, BODY)
    assert missing.status == 401 and error_of(missing)[0] == "authentication_error"
    for header in ({"x-api-key": "correct-horse"}, {"authorization": "Bearer correct-horse"}):
        door.script("ok")
        assert call(app, "POST", PATH, BODY, header).status == 200
    assert door.user_of(1) == door.user_of(2) == "kate"
    door.stage.throttle_s = 2
    throttled = call(app, "POST", PATH, BODY, {"x-api-key": "guess"})
    assert throttled.status == 429 and throttled.headers["retry-after"] == "2"


# --- every refusal as Anthropic says it ---------------------------------------------------------


@pytest.mark.parametrize(
    "code, status, kind, retry_after",
    [
        ("busy", 429, "rate_limit_error", "1"),
        ("quota_exceeded", 429, "rate_limit_error", "60"),
        ("too_long", 400, "invalid_request_error", None),
        ("bad_request", 400, "invalid_request_error", None),
        ("unavailable", 529, "overloaded_error", "5"),
        ("shutting_down", 529, "overloaded_error", "1"),
    ],
)
def test_each_refusal_is_its_status_and_type_with_retry_after(code, status, kind, retry_after):
    door = FakeFrontdoor()
    door.refuse_next(code, f"refused: {code}", {"1": 0.5, "60": 60, "5": 4.1}.get(retry_after, 0))
    answer = call(app_of(door), "POST", PATH, BODY)
    assert answer.status == status and error_of(answer) == (kind, f"refused: {code}")
    assert answer.headers.get("retry-after") == retry_after


def test_the_per_user_cap_is_a_429_with_retry_after_while_one_streams():
    async def scenario():
        door = FakeFrontdoor(ServerConfig(max_inflight_per_user=1))
        app = app_of(door)
        first = HttpExchange(app, "POST", PATH, BODY | {"stream": True}).start()
        held = await door.admitted(1)
        second = await HttpExchange(app, "POST", PATH, BODY).start().finished()
        assert second.status == 429 and second.headers["retry-after"] == "1"
        assert "in flight" in error_of(second)[1]
        door.finish(held)
        assert (await first.finished()).status == 200

    asyncio.run(scenario())


# --- streams and whole messages -----------------------------------------------------------------


def test_a_stream_is_message_start_a_text_block_message_delta_and_stop_in_order():
    async def scenario():
        door = FakeFrontdoor()
        stream = HttpExchange(app_of(door), "POST", PATH, BODY | {"stream": True}).start()
        request = await door.admitted()
        await wait_for(lambda: stream.chunks, what="message_start")
        for n, text in enumerate(["Par", "is"], start=3):
            door.token(request, text)
            await wait_for(lambda n=n: len(stream.chunks) >= n, what=text)
        door.finish(request, "length", prompt_tokens=9, completion_tokens=2, cached_tokens=4)
        return await stream.finished()

    stream = asyncio.run(scenario())
    assert stream.headers["content-type"].startswith("text/event-stream")
    got = events(stream)
    assert [name for name, _ in got] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    shell = got[0][1]["message"]
    assert shell["content"] == [] and shell["stop_reason"] is None and shell["model"] == "tiny"
    assert shell["usage"]["input_tokens"] == 7  # the whole prompt, before the cache is known
    assert got[1][1]["content_block"] == {"type": "text", "text": ""}
    assert [d["delta"] for _, d in got[2:4]] == [
        {"type": "text_delta", "text": "Par"},
        {"type": "text_delta", "text": "is"},
    ]
    delta = got[5][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"] == {"input_tokens": 5, "cache_creation_input_tokens": 0,
                              "cache_read_input_tokens": 4, "output_tokens": 2}  # fmt: skip


def test_a_whole_message_says_its_stop_sequence_and_an_unrecorded_one_says_so():
    door = FakeFrontdoor(records_usage=True)
    door.script("Paris", stop="\n\n", recorded=False)
    answer = call(app_of(door), "POST", PATH, BODY | {"stop_sequences": ["\n\n"]})
    body = answer.json()
    assert body["content"] == [{"type": "text", "text": "Paris"}]
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "\n\n")
    assert body["type"] == "message" and body["recorded"] is False
    door.script("Paris")
    assert call(app_of(door), "POST", PATH, BODY).json()["stop_reason"] == "end_turn"


def test_thinking_and_a_call_are_blocks_whole_and_streamed():
    reply = ("<think>It wants the weather.</think>Let me check.<tool_call>\n"
             '{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>')  # fmt: skip
    pieces = [reply[i : i + 5] for i in range(0, len(reply), 5)]
    door = FakeFrontdoor(models={"tiny": FakeModel(formats=HERMES_THINKING)})
    body = BODY | {"tools": [WEATHER]}
    door.script(*pieces)
    whole = call(app_of(door), "POST", PATH, body).json()
    assert [b["type"] for b in whole["content"]] == ["thinking", "text", "tool_use"]
    assert whole["content"][0] == {"type": "thinking", "thinking": "It wants the weather.",
                                   "signature": ""}  # fmt: skip
    call_block = whole["content"][2]
    assert call_block["id"].startswith("toolu_") and call_block["input"] == {"city": "Paris"}
    assert whole["stop_reason"] == "tool_use"
    door.script(*pieces)
    streamed = events(call(app_of(door), "POST", PATH, body | {"stream": True}))
    kinds = {d["delta"]["type"] for n, d in streamed if n == "content_block_delta"}
    assert kinds == {"thinking_delta", "signature_delta", "text_delta", "input_json_delta"}
    deltas = [d["delta"] for n, d in streamed if n == "content_block_delta"]
    fragments = [d["partial_json"] for d in deltas if d["type"] == "input_json_delta"]
    assert json.loads("".join(fragments)) == {"city": "Paris"}
    assert streamed[-2][1]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize(
    "finish, error_code, status, kind",
    [("error", "internal", 500, "api_error"), ("error", "unavailable", 529, "overloaded_error")],
)
def test_a_reply_the_engine_fails_is_an_error_event_or_its_status(finish, error_code, status, kind):
    door = FakeFrontdoor()
    door.script("Par", finish_reason=finish, error="decode failed", error_code=error_code)
    streamed = events(call(app_of(door), "POST", PATH, BODY | {"stream": True}))
    assert streamed[-1][0] == "error" and streamed[-1][1]["error"]["type"] == kind
    assert "message_stop" not in [n for n, _ in streamed]
    door.script("Par", finish_reason=finish, error="decode failed", error_code=error_code)
    whole = call(app_of(door), "POST", PATH, BODY)
    assert whole.status == status and error_of(whole)[0] == kind


# --- a client that goes away --------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_mid_reply_cancels_the_request(stream):
    async def scenario():
        door = FakeFrontdoor()
        exchange = HttpExchange(app_of(door), "POST", PATH, BODY | {"stream": stream}).start()
        request = await door.admitted()
        door.token(request, "Par")
        if stream:
            await wait_for(lambda: len(exchange.chunks) >= 3)
        exchange.leave()
        await wait_for(lambda: door.cancelled, what="the request cancelled")
        await exchange.finished()
        assert door.cancelled == [request] and not exchange.is_complete

    asyncio.run(scenario())


# --- count_tokens -------------------------------------------------------------------------------


def test_count_tokens_renders_the_prompt_as_a_message_would_without_submitting():
    door = FakeFrontdoor()
    app = app_of(door)
    body = {"model": "tiny", "messages": ASK, "system": "Be brief."}
    counted = call(app, "POST", f"{PATH}/count_tokens", body)
    assert counted.status == 200 and counted.json() == {"input_tokens": 9}
    assert door.submitted == [] and door.prompts.asked[0][0] == "chat"
    door.refuse_next("unavailable", "model tiny could not be loaded", 30)
    refused = call(app, "POST", f"{PATH}/count_tokens", body)
    assert refused.status == 529 and refused.headers["retry-after"] == "30"
    assert call(app, "POST", f"{PATH}/count_tokens", body | {"model": "x"}).status == 404
    door.prompts.too_long = 5000
    too_long = call(app, "POST", f"{PATH}/count_tokens", body)
    assert too_long.status == 400 and error_of(too_long)[1].startswith("prompt is too long: ")


def test_person_headers_name_someone_only_from_a_trusted_frontends_key():
    config = ServerConfig(trusted_frontends=["webui"])
    door = FakeFrontdoor(config, Access({"kate": "kate-key", "webui": "webui-key"}))
    app = app_of(door)
    for key in ("kate-key", "webui-key"):
        door.script("ok")
        headers = {"x-api-key": key, "x-openwebui-user-name": "Bob", "x-openwebui-user-id": "7"}
        assert call(app, "POST", PATH, BODY, headers).status == 200
    assert [door.user_of(1), door.user_of(2)] == ["kate", "webui/bob"]
    other = {"x-api-key": "webui-key", "x-openwebui-user-name": "Bob", "x-openwebui-user-id": "8"}
    taken = call(app, "POST", PATH, BODY, other)  # bob is another account's name now
    assert taken.status == 403 and error_of(taken)[0] == "permission_error"


def test_under_v1_messages_errors_are_anthropics_and_elsewhere_the_other_doors():
    """Mounted beside the OpenAI API as serve/app.py mounts them: each path keeps its shape."""
    door = FakeFrontdoor()
    routes = anthropic.routes(door) + openai.routes(door)
    handlers = anthropic.exception_handlers(openai.exception_handlers())
    app = Starlette(routes=routes, exception_handlers=handlers)
    mine = call(app, "POST", f"{PATH}/batches", {})
    assert mine.status == 404 and error_of(mine)[0] == "not_found_error"
    theirs = call(app, "GET", "/v1/nothing")
    assert theirs.status == 404 and theirs.json()["error"]["code"] == "not_found"


def test_a_waiting_stream_hears_its_place_and_predicted_wait_in_a_comment_after_message_start():
    async def scenario():
        door = FakeFrontdoor()
        stream = HttpExchange(app_of(door), "POST", PATH, BODY | {"stream": True}).start()
        request = await door.admitted()
        await wait_for(lambda: stream.chunks, what="message_start")
        door.queued(request, 2, 7.0)
        await wait_for(lambda: b": queued" in stream.body, what="the note")
        door.token(request, "Paris")
        door.finish(request)
        await stream.finished()
        return stream.body.decode()

    blocks = asyncio.run(scenario()).split("\n\n")[:-1]
    assert blocks[0].startswith("event: message_start")
    assert blocks[1] == ": queued position=2 wait_s=7.0"
    assert all(b.startswith("event: ") for b in blocks[2:])
