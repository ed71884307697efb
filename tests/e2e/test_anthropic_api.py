"""The Anthropic Messages API, driven by the official `anthropic` package against a real server
on a loopback port with the real model; the tool-use round trip scripted on the fake runner
(the embedded base model calls no tools by itself); raw events, errors and hostile bodies
checked with a plain HTTP client; errors, the raw stream's order and the fuzzer on `stand_in`,
the fake runner under the model's name."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse

import anthropic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localserve.bench.fake_server import FakeServer
from localserve.ops.auth import Access
from localserve.serve.anthropic.blocks import SIGNATURE
from localserve.serve.anthropic.validation import DEFAULT_USER
from tests.support.clients import http_request as request
from tests.support.fakes import ScriptedRunner, prefilling
from tests.support.live import configured
from tests.support.waiting import wait_until

MODEL = "gemma-3-270m"
QUESTION = "What is the capital of France?"
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}


def client(server, key: str = "any", timeout: float = 180) -> anthropic.Anthropic:
    """No retries (a 429 or 529 is the test's to see); long timeouts: the first forced call
    builds the grammar tokenizer (seconds)."""
    return anthropic.Anthropic(base_url=server.http, api_key=key, max_retries=0, timeout=timeout)


def sampled(temperature: float, **more) -> dict:
    """Anthropic's sampling fields, sent raw: the package's newest versions dropped them from
    `create`'s arguments, older clients and other SDKs still send them."""
    return {"temperature": temperature, **more}


def ask(text: str = QUESTION) -> list[dict]:
    return [{"role": "user", "content": text}]


def error_of(payload: bytes) -> tuple[str, str]:
    body = json.loads(payload)
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return body["error"]["type"], body["error"]["message"]


def events_of(payload: bytes) -> list[tuple[str, dict]]:
    """Server-sent events: (event, data) each, the event's name the data's type."""
    out = []
    for chunk in payload.decode().split("\n\n"):
        if not chunk:
            continue
        name_line, data_line = chunk.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        out.append((name, data))
    return out


# --- the real model, through the anthropic package ----------------------------------------------


@pytest.mark.model
def test_a_whole_message_with_a_system_prompt_and_its_usage(live):
    c = client(live)
    reply = c.messages.create(  # greedy: a sampled reply may be a lone newline (CI drew one)
        model=MODEL, max_tokens=20, system="You answer briefly.", messages=ask(),
        extra_body=sampled(0),
    )  # fmt: skip
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert reply.model == MODEL and reply.stop_reason in ("end_turn", "max_tokens")
    [block] = reply.content
    assert block.type == "text" and block.text.strip()
    usage = reply.usage
    assert 0 < usage.output_tokens <= 20 and usage.cache_creation_input_tokens == 0
    counted = c.messages.count_tokens(model=MODEL, system="You answer briefly.", messages=ask())
    assert usage.input_tokens + usage.cache_read_input_tokens == counted.input_tokens > 10
    blocks = [{"type": "text", "text": "You answer"}, {"type": "text", "text": "briefly."}]
    other = c.messages.count_tokens(model=MODEL, system=blocks, messages=ask())
    assert other.input_tokens >= counted.input_tokens  # the blocks joined
    live.wait_idle()


@pytest.mark.model
def test_a_stream_gives_text_and_the_final_message(live):
    with client(live).messages.stream(
        model=MODEL, max_tokens=30, messages=ask(), metadata={"user_id": "someone"},
        extra_body=sampled(0.5, top_p=0.9, top_k=1),  # the fields taken; one candidate: no blank
    ) as stream:  # fmt: skip
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.strip() and final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 0
    live.wait_idle()


@pytest.mark.model
def test_max_tokens_and_stop_sequences_say_why_the_reply_ended(live):
    c = client(live)
    reply = c.messages.create(model=MODEL, max_tokens=3, messages=ask("Tell me a long story."))
    assert (reply.stop_reason, reply.stop_sequence, reply.usage.output_tokens) == (
        "max_tokens", None, 3
    )  # fmt: skip
    count = ask("Count from 1 to 10: 1, 2, 3, 4,")
    reply = c.messages.create(
        model=MODEL, max_tokens=40, messages=count, stop_sequences=["6"], extra_body=sampled(0)
    )
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "6"), reply
    assert "6" not in reply.content[0].text
    with c.messages.stream(
        model=MODEL, max_tokens=40, messages=count, stop_sequences=["6"], extra_body=sampled(0)
    ) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "6")
    live.wait_idle()


def test_the_raw_stream_is_anthropics_events_in_order(stand_in):
    # greedy and a question with a long answer: the reply runs to max_tokens (sampled, the
    # base model may stop within 5 tokens)
    messages = ask("Tell me a long story.")
    body = {"model": MODEL, "max_tokens": 5, "messages": messages, "stream": True, **sampled(0)}
    status, headers, payload = request(stand_in, "POST", "/v1/messages", body)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = events_of(payload)
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names[1] == "content_block_start" and names[-3] == "content_block_stop"
    assert set(names[2:-3]) == {"content_block_delta"}
    shell = events[0][1]["message"]
    assert shell["content"] == [] and shell["stop_reason"] is None and shell["usage"]
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 5
    assert all(d["delta"]["type"] == "text_delta" for n, d in events if n == "content_block_delta")


def test_errors_are_raised_as_the_packages_exceptions(stand_in):
    c = client(stand_in)
    with pytest.raises(anthropic.NotFoundError) as e:
        c.messages.create(model="claude-sonnet-4-5", max_tokens=5, messages=ask())
    assert MODEL in e.value.message
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": 5}])
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=MODEL, messages=ask(), max_tokens=0)
    assert "max_tokens" in e.value.message
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": [image]}]
        )
    assert "image" in e.value.message and "messages.0.content.0.type" in e.value.message
    status, _, payload = request(
        stand_in, "POST", "/v1/messages", {"model": MODEL, "messages": ask()}
    )
    assert status == 400 and "max_tokens" in error_of(payload)[1]
    status, _, payload = request(stand_in, "GET", "/v1/messages")
    assert status == 405 and error_of(payload)[0] == "invalid_request_error"
    status, _, payload = request(stand_in, "POST", "/v1/messages/batches", {})
    assert status == 404 and error_of(payload)[0] == "not_found_error"
    status, _, payload = request(stand_in, "GET", "/v1/nothing")
    assert status == 404 and "message" in json.loads(payload)["error"]  # OpenAI's shape there


@pytest.mark.model
def test_a_token_server_needs_a_users_key_and_names_the_user_by_it(live):
    with configured(live, access=Access({"kate": "correct-horse"})):
        with pytest.raises(anthropic.AuthenticationError):
            client(live, "wrong").messages.create(model=MODEL, max_tokens=2, messages=ask())
        status, _, payload = request(live, "POST", "/v1/messages/count_tokens", b"{")
        assert status == 401 and error_of(payload)[0] == "authentication_error"  # before the body
        reply = client(live, "correct-horse").messages.create(
            model=MODEL, max_tokens=2, messages=ask()
        )
        assert reply.usage.output_tokens > 0
        bearer = anthropic.Anthropic(base_url=live.http, auth_token="correct-horse", max_retries=0)
        assert bearer.messages.count_tokens(model=MODEL, messages=ask()).input_tokens > 5
        sock = held_message(live, "correct-horse")
        wait_until(lambda: prefilling(live, "kate"), 30, "kate's request, named by her key")
        sock.close()
    live.wait_idle()


@pytest.mark.model
def test_the_same_limits_hold_a_429_with_retry_after(live):
    with configured(live, access=Access({"kate": "k1", "liz": "k2"}), max_inflight_per_user=1):
        sock = held_message(live, "k1")
        wait_until(lambda: prefilling(live, "kate"), 30, "kate's prefill under way")
        with pytest.raises(anthropic.RateLimitError) as e:
            client(live, "k1").messages.create(model=MODEL, max_tokens=2, messages=ask())
        assert int(e.value.response.headers["Retry-After"]) >= 1
        other = client(live, "k2").messages.create(model=MODEL, max_tokens=2, messages=ask())
        assert other.usage.output_tokens > 0  # someone else is not held back
        sock.close()
    live.wait_idle()


def held_message(live, key: str, user: str = "tell me more " * 900) -> socket.socket:
    """A whole message in its long prefill, on a raw socket."""
    body = json.dumps({"model": MODEL, "max_tokens": 50, "messages": ask(user)}).encode()
    url = urllib.parse.urlsplit(live.http)
    sock = socket.create_connection((url.hostname, url.port))
    head = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: %s\r\nContent-Length: %d\r\n\r\n"
    sock.sendall(head % (key.encode(), len(body)) + body)
    return sock


@pytest.mark.model
def test_an_open_server_names_the_user_anthropic_and_a_dropped_request_frees_its_cells(live):
    before = live.snapshot()
    sock = held_message(live, "any-key")  # an open server ignores the key
    row = wait_until(lambda: prefilling(live, DEFAULT_USER), 30, "its prefill, as anthropic")
    sock.close()
    assert row.computed_tokens + 4 * 256 < row.prompt_tokens, row
    deadline = time.monotonic() + 60
    while live.snapshot().counters.cancellations == before.counters.cancellations:
        assert time.monotonic() < deadline, "the request was not cancelled"
        time.sleep(0.05)
    after = live.wait_idle()
    assert after.counters.generation_tokens == before.counters.generation_tokens


@pytest.mark.model
def test_closing_a_stream_mid_reply_cancels_it(live):
    # greedy, prompts whose replies run long (the first runs to max_tokens): a reply that ended
    # by itself between the look at the running set and the close would cancel nothing
    long_ones = ("Count from 1 to 300, one number per line.", "Tell me a long story.")
    for text in long_ones:
        before = live.snapshot().counters.cancellations
        with client(live).messages.stream(
            model=MODEL, max_tokens=1500, messages=ask(text), extra_body=sampled(0.0)
        ) as stream:
            for i, _ in enumerate(stream.text_stream):
                if i == 5:
                    break
            running = DEFAULT_USER in {s.user for s in live.snapshot().seqs}
        if running:
            gone = lambda b=before: live.snapshot().counters.cancellations > b  # noqa: E731
            wait_until(gone, 30, "cancelled")
            break
        live.wait_idle()
    else:
        pytest.fail("every reply stopped within five pieces")
    live.wait_idle()


@pytest.mark.model
def test_tool_choice_any_forces_a_call_on_the_real_model(live):
    reply = client(live).messages.create(
        model=MODEL, max_tokens=80, messages=ask("What is the weather in Paris?"),
        tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )  # fmt: skip
    assert reply.stop_reason == "tool_use", reply
    [call] = reply.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    assert set(call.input) == {"city", "unit"} and call.input["unit"] in ("celsius", "fahrenheit")
    named = client(live).messages.create(
        model=MODEL, max_tokens=80, messages=ask("What is the weather in Paris?"),
        tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
    )  # fmt: skip
    assert named.stop_reason == "tool_use" and named.content[0].name == "get_weather"
    live.wait_idle()


# --- what a model writes unforced (a call, its thinking), scripted ------------------------------

SCRIPTED_TEMPLATE = "{% if tools %}<tool_call>{% endif %}<think></think>"  # the formats read
SCRIPTED_REPLY = (
    "<think>The user wants the weather; I should call the tool.</think>"
    "Let me check.<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    "</tool_call>"
)


def scripted(reply: str = SCRIPTED_REPLY, **config) -> FakeServer:
    pieces = [reply[i : i + 3] for i in range(0, len(reply), 3)]  # tags split across tokens
    runner = ScriptedRunner(step_s=0.001, reply=pieces, template_source=SCRIPTED_TEMPLATE)
    return FakeServer(runner=runner, **config)


def test_a_scripted_tool_use_round_trip_whole_and_streamed():
    server = scripted()
    try:
        c = client(server, timeout=30)
        question = ask("What is the weather in Paris?")
        thinking = {"type": "enabled", "budget_tokens": 1024}
        reply = c.messages.create(
            model="fake", max_tokens=200, messages=question, tools=[WEATHER], thinking=thinking
        )
        assert reply.stop_reason == "tool_use"
        assert [b.type for b in reply.content] == ["thinking", "text", "tool_use"]
        think, text, call = reply.content
        assert think.thinking.startswith("The user wants") and think.signature == SIGNATURE
        assert text.text == "Let me check."
        assert (call.name, call.input) == ("get_weather", {"city": "Paris", "unit": "celsius"})
        with c.messages.stream(
            model="fake", max_tokens=200, messages=question, tools=[WEATHER]
        ) as stream:
            final = stream.get_final_message()
        assert final.stop_reason == "tool_use"
        assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
        assert final.content[2].input == call.input  # input_json_delta reassembled
        assert final.content[0].thinking == think.thinking
        history = [
            *question,
            {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                              for b in reply.content]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "21 degrees"},
                {"type": "text", "text": "And tomorrow?"},
            ]},
        ]  # fmt: skip
        answer = c.messages.create(model="fake", max_tokens=200, messages=history, tools=[WEATHER])
        assert answer.content and answer.usage.input_tokens > 0
        counted = c.messages.count_tokens(model="fake", messages=history, tools=[WEATHER])
        assert counted.input_tokens == answer.usage.input_tokens + (
            answer.usage.cache_read_input_tokens
        )
        failed = [{"type": "tool_result", "tool_use_id": call.id, "is_error": True,
                   "content": [{"type": "text", "text": "no such city"}]}]  # fmt: skip
        history[-1] = {"role": "user", "content": failed}
        assert c.messages.create(model="fake", max_tokens=5, messages=history).content
    finally:
        server.close()


def test_the_raw_stream_of_a_call_and_its_thinking():
    server = scripted()
    try:
        body = {"model": "fake", "max_tokens": 200, "stream": True, "tools": [WEATHER],
                "messages": ask("weather?")}  # fmt: skip
        status, _, payload = request(server, "POST", "/v1/messages", body)
        assert status == 200
        events = events_of(payload)
        starts = [d["content_block"] for n, d in events if n == "content_block_start"]
        assert [b["type"] for b in starts] == ["thinking", "text", "tool_use"]
        assert starts[2]["input"] == {} and starts[2]["name"] == "get_weather"
        deltas = [d["delta"]["type"] for n, d in events if n == "content_block_delta"]
        assert {"thinking_delta", "signature_delta", "text_delta", "input_json_delta"} == set(
            deltas
        )
        stops = [d["index"] for n, d in events if n == "content_block_stop"]
        assert stops == [0, 1, 2]
        assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    finally:
        server.close()


def tool_use(*ids: str) -> dict:
    calls = [{"type": "tool_use", "id": i, "name": "get_weather",
              "input": {"city": "Paris", "unit": "celsius"}} for i in ids]  # fmt: skip
    return {"role": "assistant", "content": [{"type": "text", "text": "Let me check."}, *calls]}


def tool_result(*ids: str) -> dict:
    results = [{"type": "tool_result", "tool_use_id": i, "content": "21 degrees"} for i in ids]
    return {"role": "user", "content": results}


WEATHER_Q = ask("What is the weather in Paris?")
# each history Anthropic's API refuses, and the field its 400 names
MALFORMED = [
    ("messages.2.content.0.tool_use_id", [*WEATHER_Q, tool_use("toolu_a"),
                                          tool_result("toolu_b")]),  # an unknown tool_use
    ("messages.0.content.0.tool_use_id", [tool_result("toolu_a")]),  # no tool_use before it
    ("messages.4.content.0.tool_use_id", [*WEATHER_Q, tool_use("toolu_a"), tool_result("toolu_a"),
                                          tool_use("toolu_b"), tool_result("toolu_a")]),
    ("messages.2.content.1.tool_use_id", [*WEATHER_Q, tool_use("toolu_a"),
                                          tool_result("toolu_a", "toolu_a")]),  # twice
    ("messages.1.content.2.id", [*WEATHER_Q, tool_use("toolu_a", "toolu_a"),
                                 tool_result("toolu_a")]),  # ids are unique
]  # fmt: skip


def test_malformed_tool_histories_are_refused_naming_the_block_and_field(fake):
    c = client(fake, timeout=30)
    for field, messages in MALFORMED:
        for count in (False, True):
            with pytest.raises(anthropic.BadRequestError) as e:
                if count:
                    c.messages.count_tokens(model="fake", messages=messages)
                else:
                    c.messages.create(model="fake", max_tokens=2, messages=messages)
            assert e.value.body["error"]["message"].startswith(field + ": "), e.value.body
    history = [*WEATHER_Q, tool_use("toolu_a", "toolu_b"), tool_result("toolu_b", "toolu_a")]
    assert c.messages.create(model="fake", max_tokens=2, messages=history).stop_reason


def test_tool_errors_name_anthropics_fields_not_openais():
    server = scripted()  # a model with a call format
    try:
        _refused_in_anthropics_names(client(server, timeout=30))
    finally:
        server.close()


def _refused_in_anthropics_names(c: anthropic.Anthropic) -> None:
    weather = WEATHER | {"input_schema": {"type": "object", "uniqueItems": True}}
    cases = [
        ("tool_choice.name: 'get_time' is not one of the tools",
         {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_time"}}),
        ("tools.0.name: ", {"tools": [WEATHER | {"name": "a b"}]}),
        ("tools.1.name: 'get_weather' is offered twice", {"tools": [WEATHER, WEATHER]}),
        ("tool_choice: 'any' needs tools", {"tool_choice": {"type": "any"}}),
        ("get_weather.input_schema: the keyword 'uniqueItems'",
         {"tools": [weather], "tool_choice": {"type": "any"}}),
        ("messages.0.content: ", {"messages": [{"role": "user", "content": 5}]}),
    ]  # fmt: skip
    for words, fields in cases:
        with pytest.raises(anthropic.BadRequestError) as e:
            c.messages.create(
                **({"model": "fake", "max_tokens": 2, "messages": WEATHER_Q} | fields)
            )
        message = e.value.body["error"]["message"]
        assert words in message and "function" not in message and "[" not in message, message


def test_the_usage_row_says_anthropic(tmp_path):
    from localserve.ops import usage_database

    server = FakeServer(state_dir=str(tmp_path), step_s=0.001)
    try:
        c = client(server, timeout=30)
        reply = c.messages.create(model="fake", max_tokens=3, messages=ask("hello"))
        with c.messages.stream(model="fake", max_tokens=2, messages=ask("hi")) as stream:
            final = stream.get_final_message()
    finally:
        server.close()  # everything written
    db = usage_database.connect(tmp_path / usage_database.DATABASE, readonly=True)
    rows = usage_database.rows_of(db)
    assert [(r.api, r.user) for r in rows] == [("anthropic", DEFAULT_USER)] * 2
    assert [r.completion_tokens for r in rows] == [
        reply.usage.output_tokens,
        final.usage.output_tokens,
    ]


def test_person_headers_name_someone_only_from_a_trusted_frontends_key(tmp_path):
    """Open WebUI's key may say on whose behalf it asks (serve/trusted_proxies.py); the same headers
    with another user's key change nothing: the request is that user's."""
    from localserve.ops import usage_database

    keys = {"openwebui": "owui-connection-key", "kate": "kates-own-token"}
    server = FakeServer(
        state_dir=str(tmp_path), step_s=0.001, access=Access(keys), trusted_frontends=["openwebui"]
    )
    person = {"X-OpenWebUI-User-Name": "Alice", "X-OpenWebUI-User-Id": "alice-id"}
    try:
        for key in ("kates-own-token", "owui-connection-key"):
            for headers in (person, {"X-Localserve-User": "bob"}):
                c = client(server, key, timeout=30).with_options(default_headers=headers)
                c.messages.create(model="fake", max_tokens=2, messages=ask("hello"))
    finally:
        server.close()  # everything written
    db = usage_database.connect(tmp_path / usage_database.DATABASE, readonly=True)
    assert [(r.api, r.user) for r in usage_database.rows_of(db)] == [
        ("anthropic", "kate"),
        ("anthropic", "kate"),
        ("anthropic", "openwebui/alice"),
        ("anthropic", "openwebui/bob"),
    ]


# --- a fuzzer for request bodies --------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
blocks = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image"])},
    optional={k: json_values | st.text(max_size=10)
              for k in ("text", "id", "name", "input", "tool_use_id", "content", "is_error")},
)  # fmt: skip
content = st.text(max_size=30) | st.lists(blocks, max_size=3) | json_values
turns = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "x"]) | json_values, "content": content}
    ),
    min_size=0,
    max_size=3,
)
bodies = st.fixed_dictionaries(
    {"model": st.just(MODEL) | json_values, "max_tokens": st.integers(-2, 3) | json_values},
    optional={
        "messages": st.just(ask()) | turns | json_values,
        "system": st.text(max_size=20) | st.lists(blocks, max_size=2) | json_values,
        **{
            k: json_values
            for k in (
                "stream",
                "stop_sequences",
                "temperature",
                "top_p",
                "top_k",
                "tools",
                "tool_choice",
                "thinking",
                "metadata",
            )
        },
    },  # fmt: skip
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=bodies, path=st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]))
def test_fuzzed_bodies_never_crash_the_server(stand_in, body, path):
    if not isinstance(body["max_tokens"], int) or body["max_tokens"] > 8:
        body["max_tokens"] = 3  # replies stay short (a wrong type is tried by the rest)
    status, headers, payload = request(stand_in, "POST", path, body)
    assert status in (200, 400, 404, 413, 429), (status, payload[:300])
    if status != 200:
        error_of(payload)
    elif headers["Content-Type"].startswith("text/event-stream"):
        names = [n for n, _ in events_of(payload)]
        assert names[-1] in ("message_stop", "error"), names
    reply = request(stand_in, "POST", "/v1/messages", {"model": MODEL, "max_tokens": 1,
                                                    "messages": ask("Hi")})  # fmt: skip
    assert reply[0] == 200
