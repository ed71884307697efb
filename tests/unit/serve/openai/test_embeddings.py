"""`POST /v1/embeddings` on a fake Frontdoor (tests/support/fake_frontdoor.py, which bounds the
inputs with admission's own checks, serve/embedding_inputs.py): the four kinds of `input`, the
reply's shape, base64 that decodes to the float vector, `dimensions` cut and renormalised, and
every hostile input a clear 400/413 in OpenAI's shape (a 10,000-item list, a 1 MiB string, ids
out of the vocabulary, dimensions out of range, wrong types) with nothing queued; a client
that leaves cancels its request. It drives serve/openai/embeddings.py and serve/http_embed.py
in memory."""

from __future__ import annotations

import asyncio
import base64
import math
import struct

import pytest
from starlette.applications import Starlette

from localserve.config import ServerConfig
from localserve.serve import openai
from tests.support.asgi import HttpExchange, call, wait_for
from tests.support.fake_frontdoor import FakeFrontdoor, FakeModel, fake_vector

PATH = "/v1/embeddings"


def app_of(door: FakeFrontdoor) -> Starlette:
    return Starlette(routes=openai.routes(door), exception_handlers=openai.exception_handlers())


def _post(door: FakeFrontdoor, body: dict):
    return call(app_of(door), "POST", PATH, body)


def test_one_string_gives_one_normalised_vector_in_openais_list_shape():
    door = FakeFrontdoor()
    answer = _post(door, {"input": "the sky is blue", "model": "tiny"})
    assert answer.status == 200
    body = answer.json()
    assert body["object"] == "list" and body["model"] == "tiny"
    assert [(d["object"], d["index"]) for d in body["data"]] == [("embedding", 0)]
    vector = body["data"][0]["embedding"]
    assert vector == pytest.approx(fake_vector([0, *door.stage.embedded_tokens[0][0][1:]], 8))
    assert math.fsum(x * x for x in vector) == pytest.approx(1.0)
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}  # a BOS and 4 words
    assert door.stage.embeddings[0].truncate is False  # OpenAI refuses too long inputs


def test_many_strings_come_back_in_their_order():
    door = FakeFrontdoor()
    texts = [f"text number {i}" for i in range(64)]
    body = _post(door, {"input": texts}).json()
    assert [d["index"] for d in body["data"]] == list(range(64))
    tokens = door.stage.embedded_tokens[0]
    assert [d["embedding"] for d in body["data"]] == [fake_vector(t, 8) for t in tokens]
    assert body["usage"]["prompt_tokens"] == 64 * 4


@pytest.mark.parametrize(
    "given, inputs",
    [([5, 6, 7], [[5, 6, 7]]), ([[5, 6], [7]], [[5, 6], [7]])],
)
def test_token_arrays_are_embedded_as_they_are(given, inputs):
    door = FakeFrontdoor()
    body = _post(door, {"input": given}).json()
    assert door.stage.embedded_tokens[0] == inputs
    assert len(body["data"]) == len(inputs)
    assert body["usage"]["prompt_tokens"] == sum(map(len, inputs))


def test_base64_is_little_endian_float32_of_the_float_vector():
    door = FakeFrontdoor()
    floats = _post(door, {"input": "hello there"}).json()["data"][0]["embedding"]
    coded = _post(door, {"input": "hello there", "encoding_format": "base64"}).json()
    raw = base64.b64decode(coded["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(floats, rel=1e-6)


def test_dimensions_cut_the_vector_and_renormalise_it():
    door = FakeFrontdoor()
    whole = _post(door, {"input": "hello there"}).json()["data"][0]["embedding"]
    cut = _post(door, {"input": "hello there", "dimensions": 3}).json()["data"][0]["embedding"]
    norm = math.sqrt(math.fsum(x * x for x in whole[:3]))
    assert cut == pytest.approx([x / norm for x in whole[:3]])


@pytest.mark.parametrize(
    "fields, param, says",
    [
        ({"input": ["a"] * 10_000}, "input", "10000 inputs; at most 2048"),
        ({"input": [[1]] * 2049}, "input", "2049 inputs; at most 2048"),
        ({"input": [[1, 2], [3, 1000]]}, "input[1][1]", "token id 1000 is not in"),
        ({"input": [-1]}, "input[0][0]", "token id -1 is not in"),
        ({"input": "x", "dimensions": 9}, "dimensions", "between 1 and this model's 8"),
        ({"input": "x", "dimensions": 0}, "dimensions", "not a positive number"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format", "float, base64"),
        ({"input": []}, "input", "at least one input"),
        ({"input": ""}, "input[0]", "empty string"),
        ({"input": ["a", ""]}, "input[1]", "empty string"),
        ({"input": [[]]}, "input[0]", "empty input"),
        ({"input": ["a", 5]}, "input", "input[1]: a number in a list of strings"),
        ({"input": [[1], "a"]}, "input", "input[1] is a string"),
        ({"input": [[1, True]]}, "input", "input[0] is a list that is not all"),
        ({"input": [1.5]}, "input", "input[0] is a number"),
        ({"input": {"text": "a"}}, "input", "Expected `str | array`"),
        ({"input": None}, "input", "Expected `str | array`"),
        ({}, None, "missing required field `input`"),
    ],
)
def test_every_bad_input_is_a_400_naming_it_and_nothing_is_queued(fields, param, says):
    door = FakeFrontdoor()
    answer = _post(door, fields)
    assert answer.status == 400, answer.json()
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert says in error["message"]
    assert door.in_flight == []


def test_an_input_past_the_models_tokens_is_refused_naming_it_its_tokens_and_the_bound():
    door = FakeFrontdoor(models={"tiny": FakeModel(max_embed_tokens=16)})
    answer = _post(door, {"input": ["short", "word " * 20]})
    error = answer.json()["error"]
    assert answer.status == 400 and error["code"] == "context_length_exceeded"
    assert error["param"] == "input[1]"
    assert error["message"].startswith("input[1]: 21 tokens; this model embeds at most 16")


def test_a_one_mib_string_is_a_413_of_the_body_bound_and_never_tokenized():
    door = FakeFrontdoor()
    answer = _post(door, {"input": "a " * (1 << 19)})
    assert answer.status == 413 and answer.json()["error"]["code"] == "request_too_large"
    assert door.stage.embeddings == []


def test_a_long_string_under_the_body_bound_is_refused_after_a_probe_of_its_head():
    door = FakeFrontdoor(config=ServerConfig(max_frame_bytes=4 << 20))
    answer = _post(door, {"input": "word " * 200_000})
    error = answer.json()["error"]
    assert answer.status == 400 and error["param"] == "input[0]"
    assert "over " in error["message"] and "at most 512 tokens" in error["message"]


@pytest.mark.parametrize(
    "code, status, retry",
    [("busy", 429, "1"), ("quota_exceeded", 429, "30"), ("shutting_down", 503, "1")],
)
def test_admissions_refusals_keep_their_status_and_retry_after(code, status, retry):
    door = FakeFrontdoor()
    door.refuse_next(code, "no", retry_after_s=30 if code == "quota_exceeded" else 0)
    answer = _post(door, {"input": "hi"})
    assert answer.status == status and answer.headers["retry-after"] == retry


def test_the_users_cap_on_requests_in_flight_holds_for_embeddings():
    async def scenario():
        door = FakeFrontdoor(config=ServerConfig(max_inflight_per_user=1))
        door.stage.hold_embeddings = True
        first = HttpExchange(app_of(door), "POST", PATH, {"input": "one"}).start()
        request = await door.admitted()
        second = await HttpExchange(app_of(door), "POST", PATH, {"input": "two"}).start().finished()
        assert second.status == 429 and "already in flight" in second.json()["error"]["message"]
        door.embedded(request, [fake_vector([1], 8)])
        assert (await first.finished()).status == 200

    asyncio.run(scenario())


def test_a_client_that_leaves_cancels_its_embedding_request():
    async def scenario():
        door = FakeFrontdoor()
        door.stage.hold_embeddings = True
        whole = HttpExchange(app_of(door), "POST", PATH, {"input": ["a", "b"]}).start()
        request = await door.admitted()
        whole.leave()
        await wait_for(lambda: door.cancelled, what="the request cancelled")
        await whole.finished()
        assert door.cancelled == [request] and whole.status is None and not door.in_flight

    asyncio.run(scenario())


def test_an_engine_failure_is_a_500_in_openais_shape():
    async def scenario():
        door = FakeFrontdoor()
        door.stage.hold_embeddings = True
        whole = HttpExchange(app_of(door), "POST", PATH, {"input": "a"}).start()
        request = await door.admitted()
        door.finish(request, "error", error="boom", completion_tokens=0)
        answer = await whole.finished()
        assert answer.status == 500 and answer.json()["error"]["code"] == "internal_error"

    asyncio.run(scenario())


def test_the_usage_row_is_the_embeddings_api():
    from localserve.serve.http_embed import EmbedReply

    assert EmbedReply.api == "embeddings"
