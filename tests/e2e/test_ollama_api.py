"""The Ollama API, driven by the official `ollama` package against a real server on a loopback
port with the real model; raw NDJSON, errors and hostile bodies checked with a plain HTTP
client. What does not depend on what the model says (validation, error shapes, framing,
cancelling, the fuzzer) runs on `stand_in`, the fake runner under the model's name; the rest is
marked `model`."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse

import ollama
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localserve.ops.auth import Access
from localserve.serve.ollama.models import VERSION
from localserve.serve.ollama.validation import DEFAULT_USER
from tests.support.clients import http_request as request
from tests.support.fakes import prefilling
from tests.support.live import configured
from tests.support.waiting import wait_until

MODEL = "gemma-3-270m"
TAGGED = MODEL + ":latest"
QUESTION = "What is the capital of France?"


def client(live, token: str | None = None) -> ollama.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return ollama.Client(host=live.http, timeout=60, headers=headers)


def ask(text: str = QUESTION) -> list[dict]:
    return [{"role": "user", "content": text}]


def error_of(payload: bytes) -> str:
    body = json.loads(payload)
    assert set(body) == {"error"}, body
    return body["error"]


# --- the model endpoints ----------------------------------------------------------------------


def test_version_tags_show_and_ps(stand_in):
    status, _, payload = request(stand_in, "GET", "/api/version")
    assert status == 200 and json.loads(payload) == {"version": VERSION}
    listed = client(stand_in).list()
    assert [m.model for m in listed.models] == [TAGGED]
    shown = client(stand_in).show(MODEL)
    assert "completion" in shown.capabilities
    assert shown.modelinfo["general.context_length"] == stand_in.server.door.max_model_len
    assert client(stand_in).show(TAGGED).capabilities == shown.capabilities
    running = client(stand_in).ps()
    assert [m.model for m in running.models] == [TAGGED]
    with pytest.raises(ollama.ResponseError) as e:
        client(stand_in).show("llama3")
    assert e.value.status_code == 404 and "not found" in e.value.error


def test_unknown_paths_and_wrong_methods_are_clear_errors(stand_in):
    # the embedding endpoints answer: tests/e2e/test_embeddings.py; pull: test_ollama_pull.py
    status, _, payload = request(stand_in, "POST", "/api/create", {"model": MODEL})
    assert status == 404 and error_of(payload)
    status, _, payload = request(stand_in, "GET", "/api/chat")
    assert status == 405 and error_of(payload)


# --- chat and generate ------------------------------------------------------------------------


@pytest.mark.model
def test_chat_streams_and_ends_with_the_done_fields(live):
    # The same seed gives the same reply only from the same numerics: alone in its steps (another
    # request's rows change the batch), and from the same cached prefix (a prompt decoded whole and
    # one resumed from its cached cells differ in the last bits), so a first ask caches the prompt.
    live.wait_idle()
    client(live).chat(model=MODEL, messages=ask(), options={"num_predict": 1})
    live.wait_idle()
    parts = list(
        client(live).chat(
            model=MODEL, messages=ask(), stream=True, options={"num_predict": 20, "seed": 1}
        )
    )
    assert len(parts) >= 2 and all(not p.done for p in parts[:-1])
    text = "".join(p.message.content for p in parts)
    assert text.strip()
    last = parts[-1]
    assert last.done and last.done_reason in ("stop", "length")
    assert last.eval_count == 20 or last.done_reason == "stop"
    assert last.prompt_eval_count > 5 and last.total_duration > last.eval_duration > 0
    live.wait_idle()
    whole = client(live).chat(model=TAGGED, messages=ask(), options={"num_predict": 20, "seed": 1})
    assert whole.done and whole.message.role == "assistant"
    assert (parts[0].model, whole.model) == (MODEL, TAGGED)  # as the request named it
    assert whole.message.content == text  # the same seed, the same reply
    live.wait_idle()


@pytest.mark.model
def test_generate_streams_and_whole(live):
    parts = list(
        client(live).generate(
            MODEL, QUESTION, stream=True, options={"num_predict": 12, "temperature": 0}
        )
    )
    assert parts[-1].done and parts[-1].eval_count <= 12
    assert "".join(p.response for p in parts).strip()
    raw = client(live).generate(MODEL, "The capital of France is", raw=True,
                                options={"num_predict": 5, "temperature": 0})  # fmt: skip
    assert raw.done and raw.response.strip() and raw.prompt_eval_count < 12
    loaded = client(live).generate(MODEL, "")
    assert loaded.done and loaded.done_reason == "load"
    live.wait_idle()


def test_raw_ndjson_framing(stand_in):
    status, headers, payload = request(
        stand_in,
        "POST",
        "/api/chat",
        {"model": MODEL, "messages": ask(), "options": {"num_predict": 5}},
    )
    assert status == 200 and headers["Content-Type"] == "application/x-ndjson"
    lines = payload.decode().split("\n")
    assert lines[-1] == "" and all(lines[:-1])
    objects = [json.loads(line) for line in lines[:-1]]
    assert [o["done"] for o in objects] == [False] * (len(objects) - 1) + [True]
    assert {"done_reason", "total_duration", "load_duration", "prompt_eval_count",
            "prompt_eval_duration", "eval_count", "eval_duration"} <= set(objects[-1])  # fmt: skip


@pytest.mark.model
def test_options_stop_and_format_json(live):
    reply = client(live).chat(
        model=MODEL,
        messages=ask("Count: 1, 2, 3, 4, 5, 6"),
        options={
            "num_predict": 40,
            "stop": [","],
            "temperature": 0,
            "top_k": 5,
            "top_p": 0.9,
            "min_p": 0.0,
            "repeat_penalty": 1.1,
            "presence_penalty": 0.1,
            "frequency_penalty": 0.1,
            "num_ctx": 8192,
            "mirostat": 0,
        },  # fmt: skip
        keep_alive="10m",
    )
    assert "," not in reply.message.content
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    shaped = client(live).chat(
        model=MODEL, messages=ask(), format=schema, options={"num_predict": 60, "temperature": 0}
    )
    if shaped.done_reason == "stop":
        assert "city" in json.loads(shaped.message.content)
    plain = client(live).generate(MODEL, QUESTION, format="json", options={"num_predict": 30})
    assert plain.response.lstrip().startswith("{")
    thinking = client(live).chat(model=MODEL, messages=ask(), think=True,
                                 options={"num_predict": 5})  # fmt: skip
    assert thinking.done
    live.wait_idle()


@pytest.mark.model
def test_a_tool_round_trip_history_is_accepted(live):
    messages = [
        *ask("What is the weather in Paris?"),
        {"role": "assistant", "content": "",
         "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny, 21 C", "tool_name": "weather"},
    ]  # fmt: skip
    reply = client(live).chat(model=MODEL, messages=messages, options={"num_predict": 10})
    assert reply.done


@pytest.mark.model
def test_tools_are_offered_and_the_capabilities_say_so(live):
    formats = live.server.door.formats
    shown = client(live).show(MODEL).capabilities
    assert ("tools" in shown) == (formats.tool is not None)
    assert ("thinking" in shown) == (formats.reasoning is not None)
    tool = {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "the weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    reply = client(live).chat(
        model=MODEL,
        messages=ask("What is the weather in Paris?"),
        tools=[tool],
        options={"num_predict": 60, "temperature": 0},
    )
    assert reply.done
    for call in reply.message.tool_calls or []:
        assert call.function.name == "weather" and isinstance(call.function.arguments, dict)
    live.wait_idle()


# --- admission: users, cancelling -------------------------------------------------------------


@pytest.mark.model
def test_a_token_server_needs_a_users_token_and_names_the_user_by_it(live):
    access = Access({"kate": "correct-horse"})
    with configured(live, access=access):
        with pytest.raises(ollama.ResponseError) as e:
            client(live).list()
        assert e.value.status_code == 401
        with pytest.raises(ollama.ResponseError) as e:
            client(live, "wrong").chat(model=MODEL, messages=ask())
        assert e.value.status_code == 401
        assert client(live, "correct-horse").list().models
        sock = held_chat(live, "correct-horse")
        wait_until(lambda: prefilling(live, "kate"), 30, "kate's request, named by her token")
        sock.close()
    live.wait_idle()


def held_chat(live, token: str) -> socket.socket:
    """A whole chat in its long prefill (a reply could stop at once), on a raw socket."""
    body = json.dumps({"messages": ask("tell me more " * 900), "stream": False}).encode()
    url = urllib.parse.urlsplit(live.http)
    sock = socket.create_connection((url.hostname, url.port))
    head = (b"POST /api/chat HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s"
            b"\r\nContent-Length: %d\r\n\r\n")  # fmt: skip
    sock.sendall(head % (token.encode(), len(body)) + body)
    return sock


@pytest.mark.model
def test_the_same_limits_hold_a_429_with_retry_after_for_that_user_only(live):
    access = Access({"kate": "correct-horse", "liz": "battery-staple"})
    with configured(live, access=access, max_inflight_per_user=1):
        sock = held_chat(live, "correct-horse")
        wait_until(lambda: prefilling(live, "kate"), 30, "kate's prefill under way")
        with pytest.raises(ollama.ResponseError) as e:
            client(live, "correct-horse").chat(model=MODEL, messages=ask())
        assert e.value.status_code == 429 and e.value.error
        status, headers, _ = request(
            live, "POST", "/api/chat", {"messages": ask()},
            {"Authorization": "Bearer correct-horse"},
        )  # fmt: skip
        assert status == 429 and int(headers["Retry-After"]) >= 1
        other = client(live, "battery-staple").chat(
            model=MODEL, messages=ask(), options={"num_predict": 2}
        )
        assert other.done  # someone else is not held back
        sock.close()
    live.wait_idle()


@pytest.mark.model
def test_an_open_server_names_the_user_ollama(live):
    sock = held_chat(live, "any-key")  # an open server ignores the key
    wait_until(lambda: prefilling(live, DEFAULT_USER), 30, "the request, as the user ollama")
    sock.close()
    live.wait_idle()


@pytest.mark.model
def test_a_dropped_chat_is_cancelled_mid_prefill_and_its_cells_freed(live):
    before = live.snapshot()
    body = json.dumps(
        {"model": MODEL, "messages": ask("tell me more " * 900), "stream": False,
         "options": {"num_predict": 50}}
    ).encode()  # fmt: skip
    with configured(live, access=Access({"leaver": "tok"})):
        url = urllib.parse.urlsplit(live.http)
        sock = socket.create_connection((url.hostname, url.port))
        head = (b"POST /api/chat HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok\r\n"
                b"Content-Length: %d\r\n\r\n")  # fmt: skip
        sock.sendall(head % len(body) + body)
        row = wait_until(lambda: prefilling(live, "leaver"), 30, "its prefill under way")
        sock.close()
        assert row.computed_tokens + 4 * 256 < row.prompt_tokens, row
        deadline = time.monotonic() + 20
        while live.snapshot().counters.cancellations == before.counters.cancellations:
            assert time.monotonic() < deadline, "the request was not cancelled"
            time.sleep(0.05)
    after = live.wait_idle()
    assert after.counters.generation_tokens == before.counters.generation_tokens


def test_closing_a_stream_mid_reply_cancels_it(stand_in):
    """Ollama has no ignore_eos and the model may stop by itself: a reply still running after
    five chunks is closed (another seed until one is)."""
    for seed in range(10):
        before = stand_in.snapshot().counters.cancellations
        stream = client(stand_in).chat(
            model=MODEL, messages=ask(), stream=True,
            options={"num_predict": 1500, "seed": seed, "temperature": 1.0},
        )  # fmt: skip
        for i, _ in enumerate(stream):
            if i == 5:
                break
        running = DEFAULT_USER in {s.user for s in stand_in.snapshot().seqs}
        stream.close()
        if running:
            gone = lambda b=before: stand_in.snapshot().counters.cancellations > b  # noqa: E731
            wait_until(gone, 10, "cancelled")
            break
        stand_in.wait_idle()
    else:
        pytest.fail("every reply stopped within five chunks")
    stand_in.wait_idle()


# --- hostile input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, words",
    [
        ({"model": MODEL, "messages": ask(), "options": {"temperature": "hot"}}, "temperature"),
        ({"model": MODEL, "messages": ask(), "options": {"num_predict": "many"}}, "num_predict"),
        ({"model": MODEL, "messages": ask(), "options": {"stop": "x"}}, "stop"),
        ({"model": MODEL, "messages": ask(), "options": []}, "options"),
        ({"model": MODEL, "messages": ask(), "options": {"temperature": -3}}, "temperature"),
        ({"model": MODEL, "messages": ask(), "options": {"num_predict": 10**9}}, "max_tokens"),
        ({"model": MODEL, "messages": ask(), "stream": "yes"}, "stream"),
        ({"model": MODEL, "messages": ask(), "format": "yaml"}, "format"),
        ({"model": MODEL, "messages": ask(), "format": {"type": 7}}, "format"),
        ({"model": MODEL, "messages": ask(), "think": "very"}, "think"),
        ({"model": MODEL, "messages": [{"role": "x", "content": "hi"}]}, "role"),
        ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "content"),
        ({"model": MODEL, "messages": "hi"}, "messages"),
        ({"model": MODEL, "messages": ask(), "tools": [{"type": "function"}]}, "tools"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x", "images": ["AA"]}]},
            "images",
        ),  # fmt: skip
        ({"model": 5, "messages": ask()}, "model"),
        ([1, 2], "object"),
    ],
)
def test_bad_chat_bodies_are_clear_400s(stand_in, body, words):
    status, _, payload = request(stand_in, "POST", "/api/chat", body)
    assert status == 400, payload[:300]
    assert words in error_of(payload), payload[:300]


def test_bad_generate_bodies_and_an_unknown_model(stand_in):
    for body, words in [
        ({"model": MODEL, "prompt": 5}, "prompt"),
        ({"model": MODEL, "prompt": "hi", "images": ["AA"]}, "images"),
        ({"model": MODEL, "prompt": "hi", "suffix": "end"}, "suffix"),
        ({"model": MODEL, "prompt": "hi", "raw": True, "system": "s"}, "raw"),
    ]:
        status, _, payload = request(stand_in, "POST", "/api/generate", body)
        assert status == 400 and words in error_of(payload), payload[:300]
    status, _, payload = request(stand_in, "POST", "/api/generate", {"model": "x", "prompt": "hi"})
    assert status == 404 and "not found" in error_of(payload)


def test_huge_deep_and_broken_bodies(stand_in):
    limit = stand_in.config.max_frame_bytes
    huge = {"model": MODEL, "messages": ask("x" * (limit + 10))}
    status, _, payload = request(stand_in, "POST", "/api/chat", huge)
    assert status == 413 and "bytes" in error_of(payload)
    deep = b'{"model": "' + MODEL.encode() + b'", "messages": [], "x": ' + b"[" * 5000 + b"]" * 5000
    deep = deep + b"}"
    status, _, payload = request(stand_in, "POST", "/api/chat", deep)
    assert status == 400 and error_of(payload)
    arguments = b'{"a":' * 3000 + b"1" + b"}" * 3000
    calls = (b'{"model":"%s","messages":[{"role":"assistant","tool_calls":[{"function":'
             b'{"name":"f","arguments":%s}}]}]}') % (MODEL.encode(), arguments)  # fmt: skip
    status, _, payload = request(stand_in, "POST", "/api/chat", calls)
    assert status in (400, 413) and error_of(payload)
    for broken in (b"{", b"", b"null", b'{"messages": [{}]}'):
        status, _, payload = request(stand_in, "POST", "/api/chat", broken)
        assert status == 400 and error_of(payload), (broken, payload)
    status, _, payload = request(stand_in, "POST", "/api/show", {"model": 5})
    assert status == 400 and error_of(payload)
    reply = client(stand_in).generate(MODEL, "Hi", options={"num_predict": 1})
    assert reply.done  # the server still answers


def test_the_usage_row_says_ollama_and_the_counts_of_the_done_object(tmp_path):
    from localserve.bench.fake_server import FakeServer
    from localserve.ops import usage_database

    server = FakeServer(state_dir=str(tmp_path), step_s=0.001)
    try:
        fake = ollama.Client(host=server.http, timeout=30)
        reply = fake.chat(model="fake", messages=ask("hello"), options={"num_predict": 3})
        parts = list(fake.generate("fake", "hello", stream=True, options={"num_predict": 2}))
    finally:
        server.close()  # everything written
    db = usage_database.connect(tmp_path / usage_database.DATABASE, readonly=True)
    rows = usage_database.rows_of(db)
    assert [(r.api, r.user) for r in rows] == [("ollama", DEFAULT_USER)] * 2
    counts = [(r.prompt_tokens, r.completion_tokens) for r in rows]
    assert counts == [
        (reply.prompt_eval_count, reply.eval_count),
        (parts[-1].prompt_eval_count, parts[-1].eval_count),
    ]


SCRIPTED_TEMPLATE = "{% if tools %}<tool_call>{% endif %}<think></think>"  # the formats read
SCRIPTED_REPLY = (
    "<think>The user wants the weather; I should call the tool.</think>"
    "Let me check.<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    "</tool_call>"
)
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}


def test_a_scripted_call_and_thinking_come_back_as_ollama_shows_them():
    """What a model writes (reasoning, a call) is scripted on the fake runner: the reply is read
    into `message.thinking` and `message.tool_calls` (arguments an object), whole and
    streamed; `show` says the model has tools and thinking."""
    from localserve.bench.fake_server import FakeServer
    from tests.support.fakes import ScriptedRunner

    pieces = [SCRIPTED_REPLY[i : i + 3] for i in range(0, len(SCRIPTED_REPLY), 3)]
    runner = ScriptedRunner(step_s=0.001, reply=pieces, template_source=SCRIPTED_TEMPLATE)
    server = FakeServer(runner=runner)
    try:
        fake = ollama.Client(host=server.http, timeout=30)
        assert {"completion", "embedding", "tools", "thinking"} == set(
            fake.show("fake").capabilities
        )
        question = ask("What is the weather in Paris?")
        reply = fake.chat(model="fake", messages=question, tools=[WEATHER], think=True)
        message = reply.message
        assert message.content == "Let me check."
        assert message.thinking.startswith("The user wants the weather")
        [call] = message.tool_calls
        assert (call.function.name, call.function.arguments) == ("get_weather", {"city": "Paris"})
        parts = list(fake.chat(model="fake", messages=question, tools=[WEATHER], stream=True))
        assert "".join(p.message.content for p in parts) == "Let me check."
        assert "".join(p.message.thinking or "" for p in parts) == message.thinking
        streamed = [c for p in parts for c in p.message.tool_calls or ()]
        assert [c.function.arguments for c in streamed] == [{"city": "Paris"}]
        generated = fake.generate("fake", "weather?", think=True)
        assert generated.thinking == message.thinking
    finally:
        server.close()


@pytest.mark.model
def test_langchain_ollama_invokes_and_streams(live):
    from langchain_ollama import ChatOllama

    chat = ChatOllama(model=MODEL, base_url=live.http, num_predict=12, temperature=0)
    answer = chat.invoke("What is the capital of France?")
    assert answer.content.strip()
    assert answer.usage_metadata["output_tokens"] <= 12
    assert "".join(c.content for c in chat.stream("Say hello.")).strip()
    live.wait_idle()


# --- a fuzzer for request bodies --------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
OPTION_NAMES = ["num_predict", "temperature", "top_p", "top_k", "min_p", "repeat_penalty",
                "seed", "stop", "frequency_penalty", "presence_penalty", "num_ctx"]  # fmt: skip
options = st.dictionaries(st.sampled_from(OPTION_NAMES), json_values, max_size=4).map(
    lambda o: o | {"num_predict": 3} if "num_predict" not in o else o
)
bodies = st.fixed_dictionaries(
    {
        "model": st.just(MODEL) | json_values,
        "options": options | json_values,
    },
    optional={
        "messages": st.just(ask())
        | st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["user", "system", "tool", "x"]) | json_values,
                    "content": st.text(max_size=30) | json_values,
                },
                optional={"tool_calls": json_values, "tool_name": json_values},
            ),
            max_size=3,
        )
        | json_values,
        "prompt": st.text(max_size=30) | json_values,
        **{
            k: json_values
            for k in (
                "stream",
                "format",
                "think",
                "keep_alive",
                "tools",
                "raw",
                "system",
                "images",
                "suffix",
            )
        },  # fmt: skip
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=bodies, path=st.sampled_from(["/api/chat", "/api/generate"]))
def test_fuzzed_bodies_never_crash_the_server(stand_in, body, path):
    given = body["options"]
    if given is None:
        body["options"] = {"num_predict": 3}  # replies stay short
    elif isinstance(given, dict):
        n = given.get("num_predict")
        if not isinstance(n, int) or n in (-1, -2) or 8 < n <= 10**6:  # -1, -2: the cap
            given["num_predict"] = 3
    status, headers, payload = request(stand_in, "POST", path, body)
    assert status in (200, 400, 404, 413, 429), (status, payload[:300])
    if status != 200:
        error_of(payload)
    elif headers["Content-Type"] == "application/x-ndjson":
        lines = payload.decode().split("\n")
        assert lines[-1] == "" and json.loads(lines[-2])["done"] is True
    reply = request(stand_in, "POST", "/api/generate", {"model": MODEL, "prompt": "Hi",
                                                     "options": {"num_predict": 1}})  # fmt: skip
    assert reply[0] == 200
