"""`POST /api/chat` and `/api/generate` on a fake Frontdoor (tests/support/fake_frontdoor.py):
bad bodies as Ollama's `{"error"}` 400s, the options and the messages as admission gets them,
every refusal's status, the per-user caps, the NDJSON lines of a stream and the done object's
fields, a reply read for its thinking and calls, a client that leaves cancelling its request,
and the model endpoints. It drives the Ollama routes (serve/ollama/__init__.py) and
serve/ollama/chat.py, reply.py, errors.py, validation.py and models.py in memory; what needs
the model stays in tests/e2e/test_ollama_api.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.applications import Starlette

from localserve.config import ServerConfig
from localserve.ops.auth import Access
from localserve.serve import ollama
from tests.support.asgi import HttpExchange, call, wait_for
from tests.support.fake_frontdoor import HERMES_THINKING, FakeFrontdoor, FakeModel

ASK = [{"role": "user", "content": "What is the capital of France?"}]
TAGGED = "tiny:latest"


def app_of(door: FakeFrontdoor) -> Starlette:
    """The Ollama API alone, mounted as serve/app.py mounts it."""
    return Starlette(routes=ollama.routes(door), exception_handlers=ollama.exception_handlers({}))


def error_of(exchange: HttpExchange) -> str:
    body = exchange.json()
    assert set(body) == {"error"}, body
    return body["error"]


def lines(exchange: HttpExchange) -> list[dict]:
    """The NDJSON objects of a stream; every line ends with a newline."""
    text = exchange.body.decode()
    assert text.endswith("\n") and "\n\n" not in text, text[-80:]
    return [json.loads(line) for line in text.split("\n")[:-1]]


# --- the body, checked before admission -------------------------------------------------------


@pytest.mark.parametrize(
    "body, words",
    [
        ({"messages": ASK, "options": {"temperature": "hot"}}, "temperature"),
        ({"messages": ASK, "options": {"num_predict": "many"}}, "num_predict"),
        ({"messages": ASK, "options": {"stop": "x"}}, "stop"),
        ({"messages": ASK, "options": []}, "options"),
        ({"messages": ASK, "stream": "yes"}, "stream"),
        ({"messages": ASK, "format": "yaml"}, "format"),
        ({"messages": ASK, "think": "very"}, "think"),
        ({"messages": ASK, "keep_alive": "x" * 40}, "keep_alive"),
        ({"messages": ASK, "keep_alive": "soon"}, "keep_alive"),
        ({"messages": [{"role": "x", "content": "hi"}]}, "role"),
        ({"messages": [{"role": "user", "content": 5}]}, "content"),
        ({"messages": [{"role": "user", "content": "x", "images": ["AA"]}]}, "images"),
        (
            {
                "messages": [
                    {"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}
                ]
            },
            "tool_calls",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f" * 65}}]}]},
            "function.name",
        ),
        ({"messages": "hi"}, "messages"),
        ({"messages": ASK, "tools": [{"type": "function"}]}, "tools"),
        ({"model": 5, "messages": ASK}, "model"),
        ([1, 2], "object"),
    ],
)
def test_a_bad_chat_body_is_a_400_naming_what_is_wrong(body, words):
    door = FakeFrontdoor(models={"tiny": FakeModel(formats=HERMES_THINKING)})
    answer = call(app_of(door), "POST", "/api/chat", body)
    assert answer.status == 400, answer.body
    assert words in error_of(answer)
    assert door.submitted == []


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"prompt": 5}, 400, "prompt"),
        ({"prompt": "hi", "images": ["AA"]}, 400, "images"),
        ({"prompt": "hi", "suffix": "end"}, 400, "suffix"),
        ({"prompt": "hi", "template": "{{ x }}"}, 400, "template"),
        ({"prompt": "hi", "context": [1, 2]}, 400, "context"),
        ({"prompt": "hi", "raw": True, "system": "s"}, 400, "raw"),
        ({"model": "llama3", "prompt": "hi"}, 404, "not found"),
    ],
)
def test_a_bad_generate_body_or_another_model_is_its_error(body, status, words):
    door = FakeFrontdoor()
    answer = call(app_of(door), "POST", "/api/generate", body)
    assert answer.status == status and words in error_of(answer)
    assert door.submitted == []


def test_hostile_sizes_and_broken_json_are_413_and_400_in_ollamas_shape():
    app = app_of(FakeFrontdoor(ServerConfig(max_frame_bytes=4096)))
    huge = call(app, "POST", "/api/chat", {"messages": [{"role": "user", "content": "x" * 5000}]})
    assert huge.status == 413 and "bytes" in error_of(huge)
    deep = b'{"messages": [], "x": ' + b"[" * 1500 + b"]" * 1500 + b"}"
    assert call(app, "POST", "/api/chat", deep).status == 400
    for broken in (b"{", b"", b"null", b'{"messages": [{}]}'):
        answer = call(app, "POST", "/api/chat", broken)
        assert answer.status == 400 and error_of(answer), broken


def test_unknown_paths_and_wrong_methods_keep_ollamas_shape():
    app = app_of(FakeFrontdoor())
    assert call(app, "POST", "/api/create", {}).status == 404
    assert call(app, "POST", "/api/delete", {}).status == 404
    wrong = call(app, "GET", "/api/chat")
    assert wrong.status == 405 and error_of(wrong)
    wrong = call(app, "GET", "/api/embed")
    assert wrong.status == 405 and error_of(wrong)


def test_a_pull_is_the_operators_and_streams_its_progress():
    door = FakeFrontdoor(access=Access({"ann": "ann-token"}, monitor_token="monitor-token"))
    app = app_of(door)
    body = {"model": "hf.co/org/repo:Q4_K_M"}
    user = call(app, "POST", "/api/pull", body, {"authorization": "Bearer ann-token"})
    assert user.status == 403 and "monitor token" in error_of(user)
    nobody = call(app, "POST", "/api/pull", body)
    assert nobody.status == 401 and door.stage.pulled == []
    operator = {"authorization": "Bearer monitor-token"}
    streamed = call(app, "POST", "/api/pull", body, operator)
    assert streamed.status == 200, streamed.body
    assert streamed.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in streamed.body.splitlines()]
    assert lines == [{"status": "pulling manifest"}, {"status": "success"}]
    whole = call(app, "POST", "/api/pull", body | {"stream": False}, operator)
    assert whole.json() == {"status": "success"}
    assert error_of(call(app, "POST", "/api/pull", {}, operator))  # no model: a 400
    long_name = body | {"localserve_name": "n" * 65}
    assert call(app, "POST", "/api/pull", long_name, operator).status == 400
    assert door.stage.pulled == [("hf.co/org/repo:Q4_K_M", None)] * 2


# --- what reaches admission ------------------------------------------------------------------


def test_the_options_map_to_the_sampling_fields_and_the_user_is_ollama():
    door = FakeFrontdoor(ServerConfig(max_tokens=500, default_max_tokens=100))
    app = app_of(door)
    options = {"num_predict": 7, "temperature": 0.2, "top_k": 5, "stop": ["\n"], "num_ctx": 8}
    for body in ({"options": options}, {"options": {"num_predict": -1}}, {}):
        door.script("ok")
        assert call(app, "POST", "/api/chat", {"messages": ASK} | body).status == 200
    first = door.fields_of(1)
    assert (first.max_tokens, first.temperature, first.top_k, first.stop) == (7, 0.2, 5, ["\n"])
    assert [door.max_tokens_of(2), door.max_tokens_of(3)] == [500, 100]  # the cap, the default
    assert door.user_of(1) == "ollama"


def test_calls_in_the_history_get_ids_that_the_tool_answers_take_in_order():
    door = FakeFrontdoor(models={"tiny": FakeModel(formats=HERMES_THINKING)})
    door.script("It is sunny.")
    calls = [{"function": {"name": "weather", "arguments": {"city": "Paris"}}},
             {"function": {"name": "time", "arguments": "{}"}}]  # fmt: skip
    answers = [{"role": "tool", "content": "sunny"}, {"role": "tool", "content": "noon"}]
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": calls}, *answers]
    assert call(app_of(door), "POST", "/api/chat", {"messages": history}).status == 200
    _, messages, _, _ = door.prompts.asked[0]
    made = messages[1].tool_calls
    assert [(c.id, c.name, c.arguments) for c in made] == [
        ("call_1_0", "weather", '{"city":"Paris"}'),
        ("call_1_1", "time", "{}"),
    ]
    assert [(m.tool_call_id, m.name) for m in messages[2:]] == [
        ("call_1_0", "weather"),
        ("call_1_1", "time"),
    ]


def test_generate_shows_its_prompt_through_the_template_unless_raw():
    door = FakeFrontdoor()
    app = app_of(door)
    door.script("ok")
    call(app, "POST", "/api/generate", {"prompt": "hi", "system": "Be brief.", "stream": False})
    door.script("ok")
    call(app, "POST", "/api/generate", {"prompt": "The capital is", "raw": True})
    chat, raw = door.prompts.asked
    assert chat[0] == "chat" and [(m.role, m.content) for m in chat[1]] == [
        ("system", "Be brief."),
        ("user", "hi"),
    ]
    assert raw[:2] == ("text", "The capital is")


def test_an_empty_chat_warms_the_model_and_keep_alive_zero_unloads_it():
    door = FakeFrontdoor()
    app = app_of(door)
    loaded = call(app, "POST", "/api/chat", {"model": TAGGED, "keep_alive": "5m"}).json()
    assert loaded["done"] and loaded["done_reason"] == "load" and loaded["model"] == TAGGED
    unloaded = call(app, "POST", "/api/generate", {"keep_alive": 0}).json()
    assert unloaded["done_reason"] == "unload" and unloaded["response"] == ""
    assert door.stage.warmed == [("tiny", 300.0), ("tiny", 0)]
    door.refuse_next("unavailable", "model tiny could not be loaded: no memory", 30)
    refused = call(app, "POST", "/api/chat", {})
    assert refused.status == 503 and "could not be loaded" in error_of(refused)
    assert door.submitted == []


def test_a_token_server_names_the_user_by_the_token_and_refuses_others():
    door = FakeFrontdoor(access=Access({"kate": "correct-horse"}))
    app = app_of(door)
    assert call(app, "POST", "/api/chat", {"messages": ASK}).status == 401
    assert call(app, "GET", "/api/tags").status == 401
    assert call(app, "GET", "/api/version").status == 200  # says nothing of anyone
    door.script("ok")
    key = {"authorization": "Bearer correct-horse"}
    assert call(app, "POST", "/api/chat", {"messages": ASK}, key).status == 200
    assert door.user_of(1) == "kate"
    door.stage.throttle_s = 3
    throttled = call(app, "POST", "/api/chat", {"messages": ASK}, key)
    assert throttled.status == 429 and throttled.headers["retry-after"] == "3"


# --- every refusal as Ollama says it ------------------------------------------------------------


@pytest.mark.parametrize(
    "code, status, retry_after",
    [
        ("busy", 429, "1"),
        ("quota_exceeded", 429, "60"),
        ("too_long", 400, None),
        ("bad_request", 400, None),
        ("unavailable", 503, "5"),
        ("shutting_down", 503, "1"),
    ],
)
def test_each_refusal_is_its_status_with_retry_after_where_waiting_helps(code, status, retry_after):
    door = FakeFrontdoor()
    door.refuse_next(code, f"refused: {code}", {"1": 0.2, "60": 59.5, "5": 5}.get(retry_after, 0))
    answer = call(app_of(door), "POST", "/api/chat", {"messages": ASK})
    assert answer.status == status and error_of(answer) == f"refused: {code}"
    assert answer.headers.get("retry-after") == retry_after


def test_the_per_user_cap_is_a_429_with_retry_after_while_one_streams():
    async def scenario():
        door = FakeFrontdoor(ServerConfig(max_inflight_per_user=1))
        app = app_of(door)
        first = HttpExchange(app, "POST", "/api/chat", {"messages": ASK}).start()
        held = await door.admitted(1)
        second = await HttpExchange(app, "POST", "/api/chat", {"messages": ASK}).start().finished()
        assert second.status == 429 and second.headers["retry-after"] == "1"
        assert "in flight" in error_of(second)
        door.finish(held)
        assert (await first.finished()).status == 200

    asyncio.run(scenario())


# --- streams and whole replies ------------------------------------------------------------------


def test_a_stream_is_one_object_a_line_then_the_done_object_with_its_counts():
    async def scenario():
        door = FakeFrontdoor()
        stream = HttpExchange(app_of(door), "POST", "/api/chat", {"model": "tiny", "messages": ASK})
        stream.start()
        request = await door.admitted()
        for n, text in enumerate(["The", " capital"], start=1):
            door.token(request, text)
            await wait_for(lambda n=n: len(stream.chunks) >= n, what=text)
        door.finish(request, "length", prompt_tokens=9, completion_tokens=2)
        return await stream.finished()

    stream = asyncio.run(scenario())
    assert stream.status == 200 and stream.headers["content-type"] == "application/x-ndjson"
    objects = lines(stream)
    assert [o["done"] for o in objects] == [False, False, True]
    assert [o["message"] for o in objects[:2]] == [
        {"role": "assistant", "content": "The"},
        {"role": "assistant", "content": " capital"},
    ]
    last = objects[-1]
    assert last["model"] == "tiny" and last["message"]["content"] == ""  # as the request named it
    assert (last["done_reason"], last["prompt_eval_count"], last["eval_count"]) == ("length", 9, 2)
    assert last["total_duration"] == 20_000_000 and last["load_duration"] == 0
    assert last["prompt_eval_duration"] == 4_000_000 and last["eval_duration"] == 15_000_000
    assert "recorded" not in last


def test_a_whole_generate_is_one_object_and_an_unrecorded_one_says_so():
    door = FakeFrontdoor(records_usage=True)
    door.script("Par", "is", recorded=False)
    answer = call(app_of(door), "POST", "/api/generate", {"prompt": "hi", "stream": False})
    body = answer.json()
    assert (body["response"], body["done"], body["done_reason"]) == ("Paris", True, "stop")
    assert body["model"] == TAGGED and body["recorded"] is False


def test_thinking_and_a_call_come_back_as_ollama_shows_them():
    door = FakeFrontdoor(models={"tiny": FakeModel(formats=HERMES_THINKING)})
    reply = ("<think>It wants the weather.</think>Let me check.<tool_call>\n"
             '{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>')  # fmt: skip
    door.script(*(reply[i : i + 4] for i in range(0, len(reply), 4)))
    tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    body = {"messages": ASK, "tools": [tool], "think": True}
    objects = lines(call(app_of(door), "POST", "/api/chat", body))
    messages = [o["message"] for o in objects]
    assert "".join(m.get("thinking", "") for m in messages) == "It wants the weather."
    assert "".join(m["content"] for m in messages) == "Let me check."
    calls = [c for m in messages for c in m.get("tool_calls", ())]
    assert calls == [{"function": {"name": "weather", "arguments": {"city": "Paris"}}}]
    assert door.prompts.asked[0][3].template_kwargs == {"enable_thinking": True}


def test_a_reply_the_engine_fails_ends_its_stream_with_an_error_line_or_is_a_500():
    door = FakeFrontdoor()
    door.script("Par", finish_reason="error", error="decode failed")
    objects = lines(call(app_of(door), "POST", "/api/chat", {"messages": ASK}))
    assert set(objects[-1]) == {"error"} and "decode failed" in objects[-1]["error"]
    door.script("Par", finish_reason="error", error="gone", error_code="unavailable")
    whole = call(app_of(door), "POST", "/api/chat", {"messages": ASK, "stream": False})
    assert whole.status == 503 and whole.headers["retry-after"] == "5"


# --- a client that goes away --------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_mid_reply_cancels_the_request(stream):
    async def scenario():
        door = FakeFrontdoor()
        body = {"messages": ASK, "stream": stream}
        exchange = HttpExchange(app_of(door), "POST", "/api/chat", body).start()
        request = await door.admitted()
        door.token(request, "The")
        if stream:
            await wait_for(lambda: exchange.chunks)
        exchange.leave()
        await wait_for(lambda: door.cancelled, what="the request cancelled")
        await exchange.finished()
        assert door.cancelled == [request] and not exchange.is_complete

    asyncio.run(scenario())


# --- the model endpoints ------------------------------------------------------------------------


def test_tags_show_and_ps_describe_the_models_tagged():
    models = {"tiny": FakeModel(formats=HERMES_THINKING, n_ctx=2048),
              "big": FakeModel(state="unloaded")}  # fmt: skip
    app = app_of(FakeFrontdoor(models=models))
    tags = call(app, "GET", "/api/tags").json()["models"]
    assert [m["name"] for m in tags] == [TAGGED, "big:latest"]
    running = call(app, "GET", "/api/ps").json()["models"]
    assert [(m["name"], m["context_length"]) for m in running] == [(TAGGED, 2048)]
    shown = call(app, "POST", "/api/show", {"model": TAGGED}).json()
    assert shown["capabilities"] == ["completion", "embedding", "tools", "thinking"]
    assert shown["model_info"]["general.context_length"] == 2048
    shown = call(app, "POST", "/api/show", {"name": "big"}).json()
    assert shown["capabilities"] == ["completion", "embedding"]
    assert call(app, "POST", "/api/show", {"model": "llama3"}).status == 404
    assert call(app, "POST", "/api/show", {}).status == 400


def test_person_headers_name_someone_only_from_a_trusted_frontends_token():
    config = ServerConfig(trusted_frontends=["webui"])
    door = FakeFrontdoor(config, Access({"kate": "kate-key", "webui": "webui-key"}))
    app = app_of(door)
    for key in ("kate-key", "webui-key"):
        door.script("ok")
        headers = {"authorization": f"Bearer {key}", "x-localserve-user": "Bob"}
        assert call(app, "POST", "/api/chat", {"messages": ASK}, headers).status == 200
    assert [door.user_of(1), door.user_of(2)] == ["kate", "webui/bob"]
    long = {"authorization": "Bearer webui-key", "x-localserve-user": "b" * 2000}
    answer = call(app, "POST", "/api/chat", {"messages": ASK}, long)
    assert answer.status == 400 and "X-Localserve-User" in error_of(answer)


def test_keep_alive_and_format_reach_admission_as_seconds_and_a_response_format():
    door = FakeFrontdoor()
    app = app_of(door)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    for body in ({"keep_alive": "5m", "format": "json"}, {"keep_alive": -1, "format": schema}):
        door.script("{}")
        assert call(app, "POST", "/api/chat", {"messages": ASK} | body).status == 200
    assert [door.keep_alive_of(1), door.keep_alive_of(2)] == [300.0, -1.0]
    assert door.response_format_of(1) == {"type": "json_object"}
    assert door.response_format_of(2)["json_schema"]["schema"] == schema


def test_a_waiting_stream_hears_its_place_and_predicted_wait_in_an_empty_chunk():
    async def scenario():
        door = FakeFrontdoor()
        body = {"model": "tiny", "messages": ASK}
        stream = HttpExchange(app_of(door), "POST", "/api/chat", body).start()
        request = await door.admitted()
        door.queued(request, 2, 4.26)
        await wait_for(lambda: b'"queue"' in stream.body, what="the note")
        door.token(request, "Paris")
        door.finish(request)
        await stream.finished()
        return stream

    objects = lines(asyncio.run(scenario()))
    note = objects[0]
    assert note["queue"] == {"position": 2, "wait_s": 4.3}
    assert note["message"] == {"role": "assistant", "content": ""} and note["done"] is False
    assert "".join(o["message"]["content"] for o in objects) == "Paris" and objects[-1]["done"]
