"""The embedding queue's packing of whole inputs into a step, alone: budget, limits, round robin
over users, credit for inputs longer than the budget, cancel."""

from __future__ import annotations

import pytest

from localserve.engine.embedding import EmbeddingQueue, EmbeddingRequest, check_embedding
from localserve.protocol.snapshot import ModelInfo


def _request(rid: str, user: str, sizes: list[int]) -> EmbeddingRequest:
    return EmbeddingRequest(rid, rid, user, [[11] * n for n in sizes], 0.0)


def _plan(queue: EmbeddingQueue, budget: float) -> list[tuple[str, int]]:
    return [(item.request.request_id, item.num_tokens) for item in queue.plan(budget)]


def test_whole_inputs_fill_the_budget_and_none_is_split():
    queue = EmbeddingQueue(max_tokens=512, max_inputs=64)
    queue.add(_request("a", "ann", [10, 10, 25, 10]))
    assert _plan(queue, 30) == [("a", 10), ("a", 10)]  # the 25-token one does not fit: it waits
    assert _plan(queue, 40) == [("a", 25), ("a", 10)]


def test_the_context_limits_bound_a_step_whatever_the_budget():
    queue = EmbeddingQueue(max_tokens=100, max_inputs=4)
    queue.add(_request("a", "ann", [30] * 10))
    assert len(_plan(queue, 1e9)) == 3  # 90 of 100 tokens
    queue = EmbeddingQueue(max_tokens=100, max_inputs=4)
    queue.add(_request("a", "ann", [1] * 10))
    assert len(_plan(queue, 1e9)) == 4


def test_users_take_turns_one_input_at_a_time():
    queue = EmbeddingQueue(max_tokens=512, max_inputs=64)
    queue.add(_request("a", "ann", [10] * 2000))
    queue.add(_request("b", "bob", [10]))
    queue.add(_request("c", "cid", [10, 10]))
    assert _plan(queue, 50) == [("a", 10), ("b", 10), ("c", 10), ("a", 10), ("c", 10)]
    # the next step starts one user later
    assert [rid for rid, _ in _plan(queue, 20)] == ["a", "a"]


def test_the_first_user_changes_every_step():
    queue = EmbeddingQueue(max_tokens=512, max_inputs=64)
    queue.add(_request("a", "ann", [10] * 100))
    queue.add(_request("b", "bob", [10] * 100))
    firsts = [_plan(queue, 10)[0][0] for _ in range(4)]
    assert firsts == ["a", "b", "a", "b"]


def test_an_input_longer_than_the_budget_goes_once_its_credit_covers_it():
    queue = EmbeddingQueue(max_tokens=512, max_inputs=64)
    queue.add(_request("long", "ann", [100]))
    queue.add(_request("short", "bob", [5] * 100))
    steps = [_plan(queue, 20) for _ in range(6)]
    assert all(("long", 100) not in s for s in steps[:4])
    assert steps[4][0] == ("long", 100)  # 4 x 20 of credit + this step's 20
    assert sum(n for _, n in steps[4]) == 100  # alone: it took the step past its budget


def test_cancel_takes_a_request_out_at_the_next_reap():
    queue = EmbeddingQueue(max_tokens=512, max_inputs=64)
    a = _request("a", "ann", [10] * 5)
    queue.add(a)
    queue.plan(20)
    queue.cancel(a)
    assert [r.request_id for r in queue.reap(1.0)] == ["a"]
    assert a.finish_reason == "cancelled" and not queue.has_work
    assert queue.plan(100) == []


def test_check_embedding_names_what_is_wrong():
    info = ModelInfo("m", "CPU", 512, 4, 64, 100, 1, 0, 1, "", max_embed_tokens=8)
    check_embedding("e", [[1, 2], [99]], info)
    for inputs, match in [
        ([], "without inputs"),
        ([[1], []], "input 1 is empty"),
        ([[1] * 9], "too_long: input 0 has 9 tokens"),
        ([[100]], r"outside \[0, 100\)"),
    ]:
        with pytest.raises(ValueError, match=match):
            check_embedding("e", inputs, info)
