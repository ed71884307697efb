"""One websocket connection (localserve/serve/websocket/connection.py) on a fake Frontdoor
(tests/support/fake_frontdoor.py) over an in-memory socket: hello and its refusals, bad frames
as `error` frames naming the id, every refusal as its error code with `retry_after_s`, the
per-user caps, a chat's frames in order (queued, tokens, done with its usage), a reply read for
its reasoning and calls, cancel and unknown ids, and a client that goes away cancelling its
requests. The real sockets' closes and limits stay in tests/e2e/test_websocket_connection.py."""

from __future__ import annotations

import asyncio

import pytest

from localserve.config import ServerConfig
from localserve.ops.auth import Access
from tests.support.asgi import wait_for
from tests.support.door_connection import connected
from tests.support.fake_frontdoor import HERMES_THINKING, FakeFrontdoor, FakeModel

ASK = [{"role": "user", "content": "What is the capital of France?"}]


def chat(request_id: str = "r1", **fields) -> dict:
    return {"type": "chat", "id": request_id, "messages": ASK} | fields


def run(scenario) -> None:
    asyncio.run(scenario())


# --- hello ------------------------------------------------------------------------------------


def test_hello_is_welcomed_with_the_model_the_context_and_the_limits():
    async def scenario():
        door = FakeFrontdoor(ServerConfig(max_inflight_per_user=3), models={
            "tiny": FakeModel(n_ctx=2048), "big": FakeModel()})  # fmt: skip
        async with connected(door) as socket:
            welcome = socket.of("welcome")[0]
            assert (welcome["model"], welcome["n_ctx"]) == ("tiny", 2048)
            assert welcome["models"] == ["tiny", "big"]
            assert welcome["limits"]["max_inflight_per_user"] == 3
            socket.say({"type": "hello", "user": "bob"})
            again = await socket.next_of("error")
            assert again["code"] == "bad_request" and "already said hello" in again["message"]

    run(scenario)


def test_a_wrong_token_is_unauthorized_and_the_third_error_before_hello_closes():
    async def scenario():
        door = FakeFrontdoor(access=Access({"ann": "right"}))
        async with connected(door, user=None) as socket:
            socket.say({"type": "hello", "user": "ann", "token": "wrong"})
            refused = await socket.next_of("error")
            assert refused["code"] == "unauthorized" and "id" not in refused
            assert door.stage.checked[0][1:] == ("user ann", "wrong", False)
            socket.say(chat())
            assert (await socket.next_of("error", n=2))["code"] == "unauthorized"
            socket.say({"type": "hello", "user": " padded"})
            await wait_for(lambda: [m for m in socket.sent if m["type"] == "websocket.close"])
            close = [m for m in socket.sent if m["type"] == "websocket.close"][0]
            assert close["code"] == 1008 and "too many errors" in close["reason"]
            assert door.submitted == []

    run(scenario)


# --- bad frames -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame, words, request_id",
    [
        ("not json", "invalid frame", None),
        ({"type": "dance"}, "invalid frame", None),
        (chat(unknown=1), "invalid frame", "r1"),
        (chat(max_tokens="many"), "invalid frame", "r1"),
        (chat(request_id=""), "id: 1-128 characters", None),
        (chat(request_id="x" * 129), "id: 1-128 characters", None),
        (chat(model="gpt-4o"), "gpt-4o", "r1"),
        (chat(messages=[{"role": "tool", "content": "4"}]), "tool_call_id", "r1"),
        (chat(tools=[{"type": "function", "function": {"name": "a b"}}]), "tools[0]", "r1"),
        (chat(chat_template_kwargs={"not a name": 1}), "chat_template_kwargs", "r1"),
    ],
)
def test_a_bad_frame_is_a_bad_request_naming_its_id_and_the_connection_goes_on(
    frame, words, request_id
):
    async def scenario():
        door = FakeFrontdoor(models={"tiny": FakeModel(formats=HERMES_THINKING)})
        async with connected(door) as socket:
            socket.say(frame)
            error = await socket.next_of("error")
            assert error["code"] == "bad_request" and words in error["message"], error
            assert error.get("id") == request_id
            door.script("Paris")
            socket.say(chat("ok"))
            assert (await socket.next_of("done", "ok"))["finish_reason"] == "stop"
            assert len(door.submitted) == 1

    run(scenario)


def test_binary_and_oversized_frames_are_bad_requests_quoting_little():
    async def scenario():
        door = FakeFrontdoor(ServerConfig(max_frame_bytes=2048))
        async with connected(door) as socket:
            socket.say_bytes(b"\x00\x01")
            assert "binary" in (await socket.next_of("error"))["message"]
            socket.say(chat(messages=[{"role": "user", "content": "x" * 3000}]))
            error = await socket.next_of("error", n=2)
            assert "exceeds 2048" in error["message"] and len(error["message"]) <= 201
            socket.say(chat(messages=[{"role": "x" * 500, "content": "hi"}], model="m" * 500))
            assert len((await socket.next_of("error", n=3))["message"]) <= 201
            assert door.submitted == []

    run(scenario)


# --- refusals and caps ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, retry_after_s, sent",
    [
        ("busy", 1, 1),
        ("quota_exceeded", 3600.04, 3600.0),
        ("too_long", 0, None),
        ("unavailable", 5, 5),
        ("shutting_down", 0, None),
        ("bad_request", 0, None),
    ],
)
def test_each_refusal_is_an_error_frame_of_its_code_with_retry_after_s(code, retry_after_s, sent):
    async def scenario():
        door = FakeFrontdoor()
        door.refuse_next(code, f"refused: {code}", retry_after_s)
        async with connected(door) as socket:
            socket.say(chat())
            error = await socket.next_of("error", "r1")
            assert (error["code"], error["message"]) == (code, f"refused: {code}")
            assert error.get("retry_after_s") == sent
            await asyncio.sleep(0.01)
            assert socket.of("queued") == [] and socket.of("done") == []

    run(scenario)


def test_the_per_user_cap_refuses_that_users_next_chat_busy_across_connections():
    async def scenario():
        door = FakeFrontdoor(ServerConfig(max_inflight_per_user=1))
        async with connected(door) as first, connected(door) as second:
            first.say(chat("a"))
            await first.next_of("queued", "a")
            second.say(chat("b"))
            busy = await second.next_of("error", "b")
            assert busy["code"] == "busy" and busy["retry_after_s"] == 1
            assert "in flight" in busy["message"]
            async with connected(door, user="bob") as other:
                door.script("ok")
                other.say(chat("c"))
                assert (await other.next_of("done", "c"))["finish_reason"] == "stop"

    run(scenario)


def test_past_the_users_queue_a_chat_is_busy_until_one_of_theirs_starts():
    async def scenario():
        door = FakeFrontdoor(ServerConfig(max_queued_per_user=1))
        async with connected(door) as socket:
            socket.say(chat("a"))
            waiting = await door.admitted(1)
            socket.say(chat("b"))
            busy = await socket.next_of("error", "b")
            assert busy["code"] == "busy" and "already queued" in busy["message"]
            door.token(waiting, "The")  # the engine took it: it no longer waits
            door.script("ok")
            socket.say(chat("c"))
            assert (await socket.next_of("done", "c"))["finish_reason"] == "stop"

    run(scenario)


# --- a chat's frames --------------------------------------------------------------------------


def test_a_chat_is_queued_then_its_tokens_in_order_then_one_done():
    async def scenario():
        door = FakeFrontdoor(records_usage=True)
        async with connected(door) as socket:
            socket.say(chat(max_tokens=20, temperature=0.5))
            queued = await socket.next_of("queued", "r1")
            assert queued == {"type": "queued", "id": "r1", "position": 1}
            request = await door.admitted()
            assert door.user_of(1) == "ann" and request.engine_id == "1:r1"
            assert (door.fields_of(1).max_tokens, door.fields_of(1).temperature) == (20, 0.5)
            for n, text in enumerate(["The", " capital", " is Paris"], start=1):
                door.token(request, text)
                await socket.next_of("token", "r1", n)
            door.finish(request, "length", prompt_tokens=9, completion_tokens=3, cached_tokens=2)
            done = await socket.next_of("done", "r1")
            kinds = [f["type"] for f in socket.frames]
            assert kinds == ["welcome", "queued", "token", "token", "token", "done"]
            assert "".join(f["text"] for f in socket.of("token")) == "The capital is Paris"
            return done

    done = asyncio.run(scenario())
    assert done["finish_reason"] == "length" and done["model"] == "tiny"
    assert done["usage"] == {"prompt_tokens": 9, "completion_tokens": 3, "cached_tokens": 2}
    assert done["timings"]["ttft_ms"] == 5.0 and done["recorded"] is True
    assert done["tool_calls"] == [] and done["dropped_messages"] == 0


def test_a_chat_waiting_for_its_model_is_queued_with_loading_and_its_done_counts_drops():
    async def scenario():
        door = FakeFrontdoor()
        door.prompts.num_dropped_messages = 3
        async with connected(door) as socket:
            socket.say(chat())
            request = await door.admitted()
            await socket.next_of("queued", "r1")
            request.loading = "loading model tiny"
            door.queued(request, 2)
            assert (await socket.next_of("queued", "r1", 2))["loading"] == "loading model tiny"
            door.finish(request)
            assert (await socket.next_of("done", "r1"))["dropped_messages"] == 3

    run(scenario)


def test_an_id_in_flight_is_refused_and_free_again_once_done():
    async def scenario():
        door = FakeFrontdoor()
        async with connected(door) as socket:
            socket.say(chat())
            await socket.next_of("queued", "r1")
            socket.say(chat())
            error = await socket.next_of("error", "r1")
            assert "already in flight" in error["message"]
            door.finish(await door.admitted())
            await socket.next_of("done", "r1")
            door.script("again")
            socket.say(chat())
            await socket.next_of("done", "r1", n=2)

    run(scenario)


def test_an_engine_failure_is_an_error_frame_then_its_done():
    async def scenario():
        door = FakeFrontdoor()
        async with connected(door) as socket:
            door.script("Par", finish_reason="error", error="decode failed")
            socket.say(chat())
            await socket.next_of("done", "r1")
            tail = [(f["type"], f.get("code")) for f in socket.frames[-2:]]
            assert tail == [("error", "internal"), ("done", None)]

    run(scenario)


def test_reasoning_streams_beside_the_text_and_the_calls_come_in_the_done():
    reply = ("<think>It wants the weather.</think>Let me check.<tool_call>\n"
             '{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>')  # fmt: skip
    tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}

    async def scenario():
        door = FakeFrontdoor(models={"tiny": FakeModel(formats=HERMES_THINKING)})
        async with connected(door) as socket:
            door.script(*(reply[i : i + 6] for i in range(0, len(reply), 6)))
            socket.say(chat(tools=[tool]))
            done = await socket.next_of("done", "r1")
            tokens = socket.of("token", "r1")
            assert "".join(t.get("reasoning", "") for t in tokens) == "It wants the weather."
            assert "".join(t["text"] for t in tokens) == "Let me check."
            assert done["finish_reason"] == "tool_calls"
            [made] = done["tool_calls"]
            assert (made["name"], made["arguments"]) == ("weather", '{"city": "Paris"}')

    run(scenario)


def test_list_models_answers_every_model_the_default_first():
    async def scenario():
        models = {"tiny": FakeModel(), "big": FakeModel(state="unloaded")}
        async with connected(FakeFrontdoor(models=models)) as socket:
            socket.say({"type": "list_models"})
            frame = await socket.next_of("models")
            assert frame["default"] == "tiny"
            assert [(m["name"], m["state"]) for m in frame["models"]] == [
                ("tiny", "loaded"),
                ("big", "unloaded"),
            ]

    run(scenario)


# --- cancelling -------------------------------------------------------------------------------


def test_a_cancel_reaches_the_door_and_the_request_ends_with_a_cancelled_done():
    async def scenario():
        door = FakeFrontdoor()
        async with connected(door) as socket:
            socket.say(chat())
            request = await door.admitted()
            door.token(request, "The")
            await socket.next_of("token", "r1")
            socket.say({"type": "cancel", "id": "r1"})
            done = await socket.next_of("done", "r1")
            assert door.cancelled == [request] and done["finish_reason"] == "cancelled"
            socket.say({"type": "cancel", "id": "r1"})  # done already: nothing in flight
            unknown = await socket.next_of("error", "r1")
            assert unknown["code"] == "unknown_id"

    run(scenario)


def test_a_cancel_while_the_prompt_is_built_stops_it_there_with_a_done_and_no_tokens():
    async def scenario():
        door = FakeFrontdoor()
        door.prompts.gate = asyncio.Event()  # the prompt is being built
        async with connected(door) as socket:
            socket.say(chat())
            await wait_for(lambda: door.prompts.asked, what="the prompt being built")
            socket.say({"type": "cancel", "id": "r1"})  # handled while it is admitted
            await wait_for(lambda: door.is_told_to_stop(1), what="told to stop")
            door.prompts.gate.set()
            done = await socket.next_of("done", "r1")
            assert done["finish_reason"] == "cancelled" and done["usage"]["completion_tokens"] == 0
            assert socket.of("token") == [] and socket.of("error") == []

    run(scenario)


def test_another_connections_ids_cannot_be_cancelled():
    async def scenario():
        door = FakeFrontdoor()
        async with connected(door) as mine, connected(door, user="eve") as theirs:
            mine.say(chat("secret"))
            await mine.next_of("queued", "secret")
            theirs.say({"type": "cancel", "id": "secret"})
            assert (await theirs.next_of("error", "secret"))["code"] == "unknown_id"
            assert door.cancelled == []

    run(scenario)


def test_a_client_that_goes_away_cancels_every_request_of_its_connection():
    async def scenario():
        door = FakeFrontdoor()
        async with connected(door) as socket:
            socket.say(chat("a"))
            socket.say(chat("b"))
            a, b = await door.admitted(1), await door.admitted(2)
            door.token(a, "The")
            await socket.next_of("token", "a")
        assert {r.client_id for r in door.cancelled} == {"a", "b"}
        assert {a.engine_id, b.engine_id}.isdisjoint(r.engine_id for r in door.in_flight)

    run(scenario)


def test_a_waiting_chat_is_told_its_place_and_predicted_wait_again_as_they_change():
    async def scenario():
        door = FakeFrontdoor()
        async with connected(door) as socket:
            socket.say(chat())
            await socket.next_of("queued", "r1")
            request = await door.admitted()
            door.queued(request, 3, 12.04)
            second = await socket.next_of("queued", "r1", 2)
            door.queued(request, 1, 0.4)
            third = await socket.next_of("queued", "r1", 3)
            return second, third

    second, third = asyncio.run(scenario())
    assert second == {"type": "queued", "id": "r1", "position": 3, "wait_s": 12.0}
    assert third == {"type": "queued", "id": "r1", "position": 1, "wait_s": 0.4}
