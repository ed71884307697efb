"""The server on the FakeRunner, in milliseconds: the websocket connection and the OpenAI API,
over real sockets but without a model.

The real-model tests (test_websocket_server.py, test_openai_api.py, test_hostile_clients.py)
cover the same paths end to end; these pin the logic down fast and deterministically.
"""

from __future__ import annotations

import http.client
import json
import threading
from dataclasses import dataclass

import openai
import pytest

from localserve.bench.blocking_ws import WS
from localserve.bench.fake_server import FakeServer, PacedRunner
from localserve.ops.auth import Access
from tests.support.clients import http_request
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def fake():
    server = FakeServer(step_s=0, n_ctx=512)
    yield server.thread
    server.close()


def api(thread, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=thread.http + "/v1", api_key=key, max_retries=0, timeout=30)


def test_websocket_chat_on_the_fake(fake):
    ws = WS(fake.url)
    assert ws.hello("ann")["type"] == "welcome"
    ws.chat("q", "hello there", max_tokens=5, ignore_eos=True)
    frames = ws.until_done("q", 10)
    assert frames[0]["type"] == "queued" and frames[-1]["usage"]["completion_tokens"] == 5
    ws.close()


def test_openai_chat_and_completions_on_the_fake(fake):
    c = api(fake)
    reply = c.chat.completions.create(
        model="fake",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        extra_body={"ignore_eos": True},
    )
    assert reply.usage.completion_tokens == 4 and reply.choices[0].finish_reason == "length"
    chunks = list(
        c.completions.create(
            model="fake", prompt="a b c", max_tokens=3, stream=True, extra_body={"ignore_eos": True}
        )
    )
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "".join(ch.choices[0].text for ch in chunks).count("w") == 3


def test_openai_unsupported_fields_are_named_on_the_fake(fake):
    c = api(fake)
    for fields, param in [
        ({"n": 3}, "n"),
        ({"logit_bias": {"5": 1}}, "logit_bias"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"max_completion_tokens": 0}, "max_tokens"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(
                model="fake", messages=[{"role": "user", "content": "x"}], **fields
            )
        assert e.value.param == param, e.value.body


def test_a_shutting_down_server_answers_503_in_openai_shape(fake):
    server = fake.server
    server.admission.is_shutting_down = True
    try:
        with pytest.raises(openai.InternalServerError) as e:
            api(fake).chat.completions.create(
                model="fake", messages=[{"role": "user", "content": "x"}]
            )
        assert e.value.status_code == 503 and e.value.code == "shutting_down"
        assert e.value.response.headers["Retry-After"] == "1"
    finally:
        server.admission.is_shutting_down = False


def test_a_whole_reply_cut_short_by_the_shutdown_is_503_with_retry_after():
    server = FakeServer(step_s=0.01, shutdown_grace_s=0.2)
    try:
        result = {}

        def ask():
            try:
                api(server.thread).chat.completions.create(
                    model="fake",
                    messages=[{"role": "user", "content": "x"}],
                    max_tokens=2000,
                    extra_body={"ignore_eos": True},
                )
            except openai.APIStatusError as e:
                result["error"] = e

        asker = threading.Thread(target=ask)
        asker.start()
        wait_until(lambda: server.snapshot().running, 30, "the reply runs")
        server.call(server.server.shutdown())  # the grace passes: the reply is cancelled
        asker.join(30)
        error = result["error"]
        assert error.status_code == 503 and error.code == "shutting_down"
        assert error.response.headers["Retry-After"] == "1"
    finally:
        server.close()


def test_models_and_unknown_paths_on_the_fake(fake):
    assert [m.id for m in api(fake).models.list().data] == ["fake"]
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(fake.http + "/v1/nothing/" + "x" * 5000, timeout=30)
    error = json.loads(e.value.read())["error"]
    assert e.value.code == 404 and len(error["message"]) < 200


def test_a_request_without_max_tokens_stops_at_the_servers_default():
    """A model that never stops (ignore_eos stands for the looping base model) is not run to the
    4096-token cap: a request without max_tokens gets default_max_tokens, 1024 unless set, and
    at most the cap."""
    ask = {"messages": [{"role": "user", "content": "hi"}], "extra_body": {"ignore_eos": True}}
    for config, expected in [({}, 1024), ({"default_max_tokens": 7}, 7), ({"max_tokens": 5}, 5)]:
        server = FakeServer(step_s=0, **config)
        try:
            c = api(server.thread)
            reply = c.chat.completions.create(model="fake", **ask)
            assert reply.choices[0].finish_reason == "length"
            assert reply.usage.completion_tokens == expected, config
            text = c.completions.create(
                model="fake", prompt="a b", stream=True, extra_body={"ignore_eos": True}
            )
            chunks = list(text)
            assert chunks[-1].choices[0].finish_reason == "length"
            assert "".join(ch.choices[0].text for ch in chunks).count("w") == expected, config
        finally:
            server.close()


@dataclass
class SpacedRunner(PacedRunner):
    """Pieces as SentencePiece models have them: a word's space before it (" w123")."""

    def piece(self, token: int) -> bytes:
        piece = super().piece(token)
        return b" " + piece.rstrip() if piece else piece


def test_transcript_replies_do_not_start_with_the_formats_space():
    server = FakeServer(chat_format="transcript", runner=SpacedRunner(step_s=0))
    try:
        ws = WS(server.url)
        assert ws.hello("ann")["type"] == "welcome"
        ws.chat("q", "hello there", max_tokens=3, ignore_eos=True)
        texts = [f["text"] for f in ws.until_done("q", 10) if f["type"] == "token"]
        ws.close()
        c, ask = api(server.thread), [{"role": "user", "content": "hi"}]
        whole = c.chat.completions.create(model="fake", messages=ask, max_tokens=3)
        stream = c.chat.completions.create(model="fake", messages=ask, max_tokens=3, stream=True)
        streamed = "".join(ch.choices[0].delta.content or "" for ch in stream)
        for reply in ("".join(texts), whole.choices[0].message.content, streamed):
            assert reply.startswith("w") and reply.count(" w") == 2, reply
        # a text completion has no chat format: its continuation is the model's, space and all
        text = c.completions.create(model="fake", prompt="a b", max_tokens=2).choices[0].text
        assert text.startswith(" w") and text.count(" w") == 2
    finally:
        server.close()


# --- one count per user across the front doors ---------------------------------------------------

ANN = "ann-secret-token"
LONG = 2000  # tokens: at 5 ms a step, a reply in flight for ten seconds


def stream_over_http(server, path: str, body: dict, headers: dict):
    """A streamed HTTP request left open (its reply in flight): the connection and its status."""
    host, port = server.http.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request(
        "POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"} | headers
    )
    return conn, conn.getresponse().status


def test_the_per_user_cap_counts_the_requests_of_every_front_door_together():
    """A user's requests in flight are one count, whatever door each came in by: one stream
    open on each of the four doors fills a cap of 4, and a fifth is busy on every door."""
    server = FakeServer(step_s=0.005, access=Access({"ann": ANN}), max_inflight_per_user=4)
    bearer = {"Authorization": f"Bearer {ANN}"}
    ask = [{"role": "user", "content": "hi"}]
    doors = {  # each door's path, its streamed body and its key's header
        "openai": ("/v1/chat/completions", {"model": "fake", "messages": ask, "stream": True,
                   "max_tokens": LONG, "ignore_eos": True}, bearer),
        "ollama": ("/api/chat", {"model": "fake", "messages": ask, "stream": True,
                   "options": {"num_predict": LONG}}, bearer),
        "anthropic": ("/v1/messages", {"model": "fake", "messages": ask, "stream": True,
                      "max_tokens": LONG}, {"x-api-key": ANN}),
    }  # fmt: skip
    ws, opened = WS(server.url), []
    try:
        assert ws.hello("ann", ANN)["type"] == "welcome"
        ws.chat("a", "hi", max_tokens=LONG, ignore_eos=True)
        for path, body, headers in doors.values():
            conn, status = stream_over_http(server.thread, path, body, headers)
            opened.append(conn)
            assert status == 200, path
        wait_until(lambda: len(server.snapshot().seqs) == 4, 30, "ann's four requests running")
        ws.chat("b", "hi", max_tokens=5)
        # admitted, it would be queued first
        answer = ws.until(lambda f: f.get("id") == "b" and f["type"] in ("error", "queued"), 30)
        refused = answer[-1]
        assert refused.get("code") == "busy", refused
        assert "4 requests of yours" in refused["message"]
        for path, body, headers in doors.values():
            status, _, payload = http_request(
                server.thread, "POST", path, body | {"stream": False}, headers
            )
            assert status == 429 and b"4 requests of yours" in payload, (path, payload[:200])
    finally:
        ws.close()
        for conn in opened:
            conn.close()
        server.close()
