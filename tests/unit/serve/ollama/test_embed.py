"""`POST /api/embed` and the legacy `POST /api/embeddings` on a fake Frontdoor
(tests/support/fake_frontdoor.py, bounding inputs with admission's checks): Ollama's reply
fields, `truncate` (default true: cut; false: a 400 naming the input), no input only loading
the model, `dimensions`, and hostile inputs in Ollama's `{"error": ...}` shape. It drives
serve/ollama/embed.py in memory."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette

from localserve.serve import ollama
from tests.support.asgi import call
from tests.support.fake_frontdoor import FakeFrontdoor, FakeModel, fake_vector


def app_of(door: FakeFrontdoor) -> Starlette:
    return Starlette(routes=ollama.routes(door), exception_handlers=ollama.exception_handlers({}))


def test_embed_answers_ollamas_fields_for_one_and_several_inputs():
    door = FakeFrontdoor()
    one = call(app_of(door), "POST", "/api/embed", {"model": "tiny", "input": "why is the sky"})
    body = one.json()
    assert set(body) == {"model", "embeddings", "total_duration", "load_duration",
                         "prompt_eval_count"}  # fmt: skip
    assert body["model"] == "tiny:latest" and body["prompt_eval_count"] == 5
    assert body["embeddings"] == [fake_vector(door.stage.embedded_tokens[0][0], 8)]
    assert body["total_duration"] == 20_000_000  # the done's e2e_ms, in nanoseconds
    several = call(app_of(door), "POST", "/api/embed", {"input": ["a b", "c", "d e f"]}).json()
    assert [len(v) for v in several["embeddings"]] == [8, 8, 8]
    assert several["prompt_eval_count"] == 3 + 2 + 4


def test_truncate_cuts_by_default_and_refuses_when_false():
    door = FakeFrontdoor(models={"tiny": FakeModel(max_embed_tokens=4)})
    text = "one two three four five six"
    cut = call(app_of(door), "POST", "/api/embed", {"input": text})
    assert cut.status == 200 and door.stage.embedded_tokens[0] == [[0, *_words(text)[:3]]]
    assert door.stage.embeddings[0].truncate is True
    refused = call(app_of(door), "POST", "/api/embed", {"input": ["ok", text], "truncate": False})
    assert refused.status == 400
    assert refused.json() == {"error": "input[1]: 7 tokens; this model embeds at most 4 tokens "
                              "an input (send it shorter, or split it)"}  # fmt: skip


def _words(text: str) -> list[int]:
    return [1 + sum(w.encode()) % 999 for w in text.split()]


@pytest.mark.parametrize("empty", [{}, {"input": ""}, {"input": []}])
def test_no_input_only_loads_the_model(empty):
    door = FakeFrontdoor()
    answer = call(app_of(door), "POST", "/api/embed", {"model": "tiny", "keep_alive": "5m"} | empty)
    assert answer.json() == {"model": "tiny:latest", "embeddings": []}
    assert door.stage.warmed == [("tiny", 300.0)] and door.stage.embeddings == []


def test_the_legacy_endpoint_takes_a_prompt_and_answers_one_embedding():
    door = FakeFrontdoor()
    body = call(app_of(door), "POST", "/api/embeddings", {"prompt": "hello there"}).json()
    assert body == {"embedding": fake_vector(door.stage.embedded_tokens[0][0], 8)}
    assert call(app_of(door), "POST", "/api/embeddings", {"prompt": ""}).json() == {"embedding": []}


def test_dimensions_cut_the_vectors():
    door = FakeFrontdoor()
    body = call(app_of(door), "POST", "/api/embed", {"input": "a", "dimensions": 2}).json()
    assert len(body["embeddings"][0]) == 2


@pytest.mark.parametrize(
    "fields, status, says",
    [
        ({"input": ["a"] * 10_000}, 400, "10000 inputs; at most 2048"),
        ({"input": "a " * (1 << 19)}, 413, "request body over"),
        ({"input": [1, 2]}, 400, "Expected `str`"),
        ({"input": {"a": 1}}, 400, "Expected `str | array | null`"),
        ({"input": ["a", ""]}, 400, "input[1]: an empty string"),
        ({"input": "a", "dimensions": 9}, 400, "dimensions: 9 is not between 1 and"),
        ({"input": "a", "dimensions": -1}, 400, "dimensions: -1 is not a positive"),
        ({"input": "a", "truncate": "yes"}, 400, "Expected `bool | null`"),
        ({"input": "a", "model": "nope"}, 404, "not found"),
    ],
)
def test_hostile_inputs_are_clear_errors_in_ollamas_shape(fields, status, says):
    door = FakeFrontdoor()
    answer = call(app_of(door), "POST", "/api/embed", fields)
    assert answer.status == status and says in answer.json()["error"]
    assert door.in_flight == []


def test_a_busy_refusal_is_a_429_with_retry_after():
    door = FakeFrontdoor()
    door.refuse_next("busy", "8 requests of yours are already in flight", retry_after_s=1)
    answer = call(app_of(door), "POST", "/api/embed", {"input": "a"})
    assert answer.status == 429 and answer.headers["retry-after"] == "1"
