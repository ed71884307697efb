"""`POST /v1/completions` and the model endpoints on a fake Frontdoor
(tests/support/fake_frontdoor.py): the prompt as it reaches the prompt builder, the fields
refused, a too-long prompt named as `prompt`, the text_completion stream; `GET /v1/models`.
It drives serve/openai/completions.py and serve/openai/models.py in memory."""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette

from localserve.ops.auth import Access
from localserve.serve import openai
from tests.support.asgi import call
from tests.support.fake_frontdoor import FakeFrontdoor, FakeModel

PATH = "/v1/completions"


def app_of(door: FakeFrontdoor) -> Starlette:
    return Starlette(routes=openai.routes(door), exception_handlers=openai.exception_handlers())


def test_a_prompt_in_a_list_of_one_is_rendered_as_text_as_it_is():
    door = FakeFrontdoor()
    door.script(" Paris")
    answer = call(app_of(door), "POST", PATH, {"prompt": ["The capital of France is"]})
    assert answer.status == 200
    assert door.prompts.asked[0][:2] == ("text", "The capital of France is")
    body = answer.json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == " Paris"
    assert "dropped_messages" not in body["usage"]


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"echo": True}, "echo"),
        ({"suffix": "end"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"logprobs": 2}, "logprobs"),
        ({"n": 3}, "n"),
        ({"prompt": 5}, "prompt"),
    ],
)
def test_what_completions_do_not_take_is_a_400_naming_it(fields, param):
    door = FakeFrontdoor()
    answer = call(app_of(door), "POST", PATH, {"prompt": "hi"} | fields)
    assert answer.status == 400 and answer.json()["error"]["param"] == param
    assert door.submitted == []


def test_a_too_long_prompt_is_context_length_exceeded_on_the_prompt():
    door = FakeFrontdoor()
    door.refuse_next("too_long", "the prompt has 5000 tokens; the context holds 4096")
    error = call(app_of(door), "POST", PATH, {"prompt": "hi"}).json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "prompt")


def test_a_completion_streams_text_completion_chunks_then_done():
    door = FakeFrontdoor()
    door.script(" Par", "is", finish_reason="length")
    answer = call(app_of(door), "POST", PATH, {"prompt": "The capital is", "stream": True})
    events = answer.body.decode().split("\n\n")[:-1]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks] == [" Par", "is", ""]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert {c["object"] for c in chunks} == {"text_completion"}


def test_the_models_are_listed_with_their_context_and_state_and_another_is_a_404():
    models = {"tiny": FakeModel(n_ctx=2048), "big": FakeModel(state="unloaded")}
    app = app_of(FakeFrontdoor(models=models))
    listed = call(app, "GET", "/v1/models").json()
    assert [(m["id"], m["max_model_len"], m["status"]) for m in listed["data"]] == [
        ("tiny", 2048, "loaded"),
        ("big", 4096, "unloaded"),
    ]
    assert call(app, "GET", "/v1/models/big").json()["id"] == "big"
    missing = call(app, "GET", "/v1/models/gpt-4o")
    assert missing.status == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_the_models_need_a_users_key_on_a_token_server():
    app = app_of(FakeFrontdoor(access=Access({"kate": "correct-horse"})))
    assert call(app, "GET", "/v1/models").status == 401
    key = {"authorization": "Bearer correct-horse"}
    assert call(app, "GET", "/v1/models", headers=key).status == 200
