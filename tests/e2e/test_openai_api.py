"""The OpenAI-compatible API, driven by the official `openai` package against a real server on a
loopback port with the real model; raw framing checked with a plain HTTP client. What does not
depend on what the model says (validation, error shapes, keys, caps, framing, cancelling, the
fuzzer) runs on `stand_in`, the fake runner under the model's name; the rest is marked `model`."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import threading
import time
import urllib.parse

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localserve.bench.blocking_ws import WS
from localserve.ops.auth import Access
from localserve.serve.openai.validation import DEFAULT_USER
from tests.support.fakes import prefilling
from tests.support.live import configured
from tests.support.waiting import wait_until

MODEL = "gemma-3-270m"
QUESTION = "What is the capital of France?"


def client(live, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=live.http + "/v1", api_key=key, max_retries=0, timeout=60)


def ask(text: str = QUESTION) -> list[dict]:
    return [{"role": "user", "content": text}]


def post(live, path: str, body, headers: dict | None = None, timeout: float = 60):
    """A plain HTTP POST: (status, headers, body bytes)."""
    url = urllib.parse.urlsplit(live.http)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, data, {"Content-Type": "application/json"} | (headers or {}))
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, response.headers, payload


def users_in_flight(live) -> set[str]:
    snap = live.snapshot()
    return {s.user for s in snap.seqs} | {w.user for w in snap.waiting_seqs}


def sse_events(payload: bytes) -> list[str]:
    """The `data:` lines of an event stream, in order; every event ends with a blank line."""
    text = payload.decode()
    assert text.endswith("\n\n"), text[-80:]
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events[:3]
    return [e[len("data: ") :] for e in events]


# --- the happy paths --------------------------------------------------------------------------


def test_models_lists_the_configured_model(stand_in):
    models = client(stand_in).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client(stand_in).models.retrieve(MODEL).id == MODEL


@pytest.mark.model
def test_chat_streams_a_role_delta_content_and_a_finish_reason(live):
    stream = client(live).chat.completions.create(
        model=MODEL,
        messages=ask(),
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    last_choice = [c for c in chunks if c.choices][-1].choices[0]
    assert last_choice.finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    usage = chunks[-1].usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens >= 0


@pytest.mark.model
def test_chat_whole_reply_matches_the_websocket_reply(live, connect):
    reply = client(live).chat.completions.create(
        model=MODEL, messages=ask(), max_tokens=16, temperature=0, user="olga"
    )
    assert reply.object == "chat.completion"
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    ws = connect()
    ws.hello("olga")
    ws.chat("a", QUESTION, max_tokens=16)
    frames = ws.until_done("a")
    ws_text = "".join(f["text"] for f in frames if f["type"] == "token")
    assert choice.message.content == ws_text  # the same prompt, the same greedy tokens
    assert reply.usage.completion_tokens == frames[-1]["usage"]["completion_tokens"]


@pytest.mark.model
def test_text_parts_and_developer_messages_are_accepted(live):
    messages = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "text", "text": QUESTION}]},
    ]
    reply = client(live).chat.completions.create(  # greedy: a sampled reply may be blank
        model=MODEL, messages=messages, max_tokens=4, temperature=0
    )
    assert reply.choices[0].message.content


@pytest.mark.model
def test_completions_stream_and_whole(live):
    c = client(live)
    prompt = "User: What is the capital of France?\nAssistant:"
    whole = c.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 8
    chunks = list(
        c.completions.create(model=MODEL, prompt=[prompt], max_tokens=8, temperature=0, stream=True)
    )
    assert "".join(ch.choices[0].text for ch in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_raw_sse_framing(stand_in):
    status, headers, payload = post(
        stand_in,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": ask(),
            "max_tokens": 6,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        },
    )
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(payload)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-2]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert len({c["id"] for c in chunks}) == 1


@pytest.mark.model
def test_a_stop_string_and_sampling_fields_are_honoured(live):
    reply = client(live).chat.completions.create(
        model=MODEL,
        messages=ask("Count: 1, 2, 3, 4, 5, 6"),
        max_tokens=30,
        stop=",",
        temperature=0.7,
        top_p=0.9,
        seed=7,
        frequency_penalty=0.5,
        presence_penalty=0.5,
        extra_body={"top_k": 20, "min_p": 0.1, "repeat_penalty": 1.1},
    )
    assert "," not in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"


# --- errors: each maps to the openai package's exception --------------------------------------


def test_errors_have_openai_shape_and_exception_types(stand_in):
    c = client(stand_in)
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-4o", messages=ask())
    assert e.value.code == "model_not_found" and e.value.param == "model"
    refused = {
        "n": {"n": 2},
        "logprobs": {"logprobs": True},
        "tools[0].function.name": {"tools": [{"type": "function", "function": {"name": "a b"}}]},
        "response_format.json_schema.schema": {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}},
            }
        },
        "response_format.type": {"response_format": {"type": "yaml"}},
        "messages[0].content[0]": {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
            ]
        },
        "temperature": {"temperature": -1},
        "messages[0].role": {"messages": [{"role": "wizard", "content": "hi"}]},
    }
    for param, fields in refused.items():
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(**({"model": MODEL, "messages": ask()} | fields))
        assert e.value.param == param, (param, e.value.body)
        assert param.split("[")[0] in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="hi", echo=True)
    assert e.value.param == "echo"


def test_too_long_is_context_length_exceeded_with_both_numbers(stand_in):
    with pytest.raises(openai.BadRequestError) as e:
        client(stand_in).chat.completions.create(model=MODEL, messages=ask("word " * 5000))
    assert e.value.code == "context_length_exceeded" and e.value.param == "messages"
    assert "4096" in e.value.message and "tokens" in e.value.message


def test_a_token_server_needs_a_users_key_and_names_the_user_by_it(stand_in):
    access = Access({"kate": "correct-horse", "liz": "battery-staple"})
    with configured(stand_in, access=access):
        with pytest.raises(openai.AuthenticationError):
            client(stand_in).models.list()
        with pytest.raises(openai.AuthenticationError) as e:
            client(stand_in, "wrong-key").chat.completions.create(model=MODEL, messages=ask())
        assert e.value.code == "invalid_api_key"
        stream = client(stand_in, "battery-staple").chat.completions.create(
            model=MODEL,
            messages=ask(),
            max_tokens=200,
            stream=True,
            user="kate",  # ignored: the key names the user
            extra_body={"ignore_eos": True},
        )
        next(iter(stream))
        users = users_in_flight(stand_in)
        stream.close()
        assert "liz" in users and "kate" not in users


def test_failed_keys_are_throttled_and_the_right_one_still_passes(stand_in):
    access = Access({"kate": "correct-horse"})
    with configured(stand_in, access=access, max_auth_failures_per_minute=3) as server:
        server.admission.authentication.throttle.window_s = 3.0  # once locked, a turn a second
        for i in range(3):
            with pytest.raises(openai.AuthenticationError):
                client(stand_in, f"guess-{i}").models.list()
        with pytest.raises(openai.RateLimitError) as e:
            client(stand_in, "guess-3").models.list()  # a fourth guess: after its turn, refused
        assert int(e.value.response.headers["Retry-After"]) > 0
        assert client(stand_in, "correct-horse").models.list().data  # right: it passes


def test_over_the_per_user_cap_is_429_with_retry_after(stand_in):
    with configured(stand_in, max_inflight_per_user=1):
        stream = client(stand_in).chat.completions.create(
            model=MODEL,
            messages=ask(),
            max_tokens=300,
            stream=True,
            user="capped",
            extra_body={"ignore_eos": True},
        )
        next(iter(stream))
        with pytest.raises(openai.RateLimitError) as e:
            client(stand_in).chat.completions.create(model=MODEL, messages=ask(), user="capped")
        assert e.value.response.headers["Retry-After"]
        assert (
            client(stand_in)
            .chat.completions.create(  # someone else is not held back
                model=MODEL, messages=ask(), max_tokens=2, user="free"
            )
            .choices
        )
        stream.close()
    stand_in.wait_idle()


@pytest.mark.model
def test_a_whole_reply_the_engine_died_under_is_503_with_retry_after(live):
    """The engine process killed under a whole (not streamed) reply: a 503 that says when."""
    result = {}

    def whole_reply() -> None:
        try:
            client(live).chat.completions.create(
                model=MODEL,
                messages=ask(),
                max_tokens=2000,
                user="orphan",
                extra_body={"ignore_eos": True},
            )
        except openai.APIStatusError as e:
            result["error"] = e

    asker = threading.Thread(target=whole_reply)
    asker.start()
    wait_until(lambda: "orphan" in users_in_flight(live), 30, "the reply runs")
    os.kill(live.engine._process.pid, signal.SIGKILL)
    asker.join(60)
    error = result["error"]
    assert error.status_code == 503 and error.code == "engine_unavailable", error
    assert error.response.headers["Retry-After"] == "5"
    wait_until(lambda: not live.engine.problem, 120, "the engine is back")
    live.wait_idle()


def test_an_oversized_body_is_413_and_bad_json_400(stand_in):
    limit = stand_in.config.max_frame_bytes
    status, _, payload = post(stand_in, "/v1/chat/completions", b"{" + b" " * limit + b"}")
    assert status == 413 and json.loads(payload)["error"]["code"] == "request_too_large"
    status, _, payload = post(stand_in, "/v1/chat/completions", b'{"model": ')
    assert status == 400 and json.loads(payload)["error"]["type"] == "invalid_request_error"
    status, _, payload = post(stand_in, "/v1/nothing", {})
    assert status == 404 and "error" in json.loads(payload)


# --- a closed stream is a cancelled request ---------------------------------------------------


def test_closing_a_stream_mid_reply_cancels_it_and_frees_the_cells(stand_in):
    before = stand_in.snapshot().counters.cancellations
    stream = client(stand_in).chat.completions.create(
        model=MODEL,
        messages=ask(),
        max_tokens=1500,
        stream=True,
        user="quitter",
        extra_body={"ignore_eos": True},
    )
    for i, _ in enumerate(stream):
        if i == 5:
            break
    stream.close()
    deadline = time.monotonic() + 30
    while stand_in.snapshot().counters.cancellations == before:
        assert time.monotonic() < deadline, "the request was not cancelled"
        time.sleep(0.05)
    stand_in.wait_idle()


@pytest.mark.model
def test_a_dropped_connection_cancels_even_mid_prefill(live):
    """A whole request whose client leaves during its prefill (~2,700 tokens: 11 chunks of
    256) is cancelled there: no token generated, no time to first token."""
    before = live.snapshot()
    body = json.dumps(
        {"model": MODEL, "messages": ask("tell me more " * 900), "max_tokens": 50, "user": "leaver"}
    ).encode()
    url = urllib.parse.urlsplit(live.http)
    sock = socket.create_connection((url.hostname, url.port))
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
    sock.sendall(head % len(body) + body)
    row = wait_until(lambda: prefilling(live, "leaver"), 30, "its prefill under way")
    sock.close()
    assert row.computed_tokens + 4 * 256 < row.prompt_tokens, row  # chunks to go when cut
    finished = wait_until(lambda: finished_event(live, row.request_id), 60, "cancelled")
    assert finished.detail == "cancelled, 0 tokens"
    after = live.wait_idle()
    assert after.counters.generation_tokens == before.counters.generation_tokens
    ttft = "time_to_first_token_seconds"
    assert after.histograms[ttft].count == before.histograms[ttft].count


def finished_event(live, request_id: str):
    return next(
        (e for e in live.snapshot().events if e.kind == "finished" and e.request_id == request_id),
        None,
    )


@pytest.mark.model
def test_a_stream_nobody_reads_is_cut_off_and_cancelled(live):
    with configured(live, write_timeout_s=1.0):
        before = live.snapshot().counters.cancellations
        body = json.dumps(
            {
                "model": MODEL,
                "messages": ask("Write a long story."),
                "max_tokens": 4000,
                "stream": True,
                "ignore_eos": True,
                "user": "sleeper",
            }
        ).encode()
        url = urllib.parse.urlsplit(live.http)
        sock = socket.create_connection((url.hostname, url.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
            b"%d\r\n\r\n%s" % (len(body), body)
        )
        deadline = time.monotonic() + 120
        while live.snapshot().counters.cancellations == before:
            assert time.monotonic() < deadline, "the reader that never reads was not cut off"
            time.sleep(0.1)
        sock.close()
    live.wait_idle()


# --- many at once; turns; users ---------------------------------------------------------------


@pytest.mark.model
def test_sixteen_http_streams_and_four_websocket_users_all_complete(live):
    results: dict[str, object] = {}

    def http_user(i: int) -> None:
        try:
            stream = client(live).chat.completions.create(
                model=MODEL,
                messages=ask(f"Question {i}: what is {i} plus {i}?"),
                max_tokens=24,
                stream=True,
                user=f"h{i % 4}",
                extra_body={"ignore_eos": True},
                stream_options={"include_usage": True},
            )
            chunks = list(stream)
            results[f"h{i}"] = chunks[-1].usage.completion_tokens
        except Exception as e:  # noqa: BLE001 - reported below
            results[f"h{i}"] = e

    def ws_user(i: int) -> None:
        try:
            ws = WS(live.url)
            ws.hello(f"w{i}")
            ws.chat("q", QUESTION, max_tokens=24, ignore_eos=True)
            results[f"w{i}"] = ws.until_done("q", 120)[-1]["usage"]["completion_tokens"]
            ws.close()
        except Exception as e:  # noqa: BLE001
            results[f"w{i}"] = e

    with configured(live, max_inflight_per_user=8, max_queued_per_user=8):
        threads = [threading.Thread(target=http_user, args=(i,)) for i in range(16)]
        threads += [threading.Thread(target=ws_user, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    assert results == {k: 24 for k in results} and len(results) == 20, results
    live.wait_idle()


@pytest.mark.model
def test_the_fifth_turn_reuses_the_conversation_and_others_do_not(live):
    c = client(live)
    messages = [{"role": "system", "content": "You are terse. " * 20}]
    cached = []
    for turn in range(5):
        messages.append({"role": "user", "content": f"Tell me fact number {turn} about cats."})
        reply = c.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=12, temperature=0, user="turner"
        )
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        cached.append((reply.usage.prompt_tokens_details.cached_tokens, reply.usage.prompt_tokens))
    assert all(hit > 0 for hit, _ in cached[1:]), cached
    hit, total = cached[-1]
    assert total - hit < 40, cached  # only the new turn (and the reply's tail) is prefilled
    other = c.chat.completions.create(
        model=MODEL, messages=messages[:-1], max_tokens=4, temperature=0, user="snoop"
    )
    assert other.usage.prompt_tokens_details.cached_tokens < hit / 2  # turner's stay turner's


def test_an_open_server_names_the_user_by_the_user_field(stand_in):
    stream = client(stand_in).chat.completions.create(
        model=MODEL,
        messages=ask(),
        max_tokens=300,
        stream=True,
        user="named",
        extra_body={"ignore_eos": True},
    )
    next(iter(stream))
    anonymous = client(stand_in).chat.completions.create(
        model=MODEL, messages=ask(), max_tokens=300, stream=True, extra_body={"ignore_eos": True}
    )
    next(iter(anonymous))
    users = users_in_flight(stand_in)
    stream.close()
    anonymous.close()
    assert {"named", DEFAULT_USER} <= users
    stand_in.wait_idle()


# --- a fuzzer for request bodies --------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = [
    "model",
    "messages",
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "n",
    "stream",
    "seed",
    "user",
    "logprobs",
    "tools",
    "response_format",
    "stream_options",
    "top_k",
    "frequency_penalty",
    "prompt",
    "max_completion_tokens",
]
bodies = st.fixed_dictionaries(
    {
        "model": st.just(MODEL) | json_values,
        "messages": st.just(ask())
        | st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["user", "system", "x"]) | json_values,
                    "content": st.text(max_size=30) | json_values,
                }
            ),
            max_size=3,
        )
        | json_values,
        "max_tokens": st.integers(-2, 4),
    },  # replies stay short
    optional={k: json_values for k in FIELDS if k not in ("model", "messages", "max_tokens")},
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=bodies, path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
def test_fuzzed_bodies_never_crash_the_server(stand_in, body, path):
    status, headers, payload = post(stand_in, path, body)
    assert status in (200, 400, 404, 413, 429), (status, payload[:300])
    if status != 200:
        error = json.loads(payload)["error"]
        assert set(error) == {"message", "type", "code", "param"}
    elif headers["Content-Type"].startswith("text/event-stream"):
        assert sse_events(payload)[-1] == "[DONE]"
    assert (
        post(stand_in, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 1})[0]
        == 200
    )
