"""Embedding requests through the engine on the fake runner: events, checks, cancel, faults,
packing under the step budget, fairness between users, running streams' ITL."""

from __future__ import annotations

import numpy as np
import pytest

from localserve.config import SchedulerConfig
from localserve.engine.events import Done, Embedded, Token
from localserve.runners.fake import fake_vector


def _inputs(n: int, length: int, salt: int = 0) -> list[list[int]]:
    return [[10 + (i * 13 + j * 7 + salt) % 900 for j in range(length)] for i in range(n)]


def _events(h, rid):
    return [e for e in h.events if getattr(e, "request_id", None) == rid]


def test_embedded_then_done_with_the_vectors_and_counts(make_harness):
    h = make_harness()
    inputs = _inputs(3, 5) + [[11, 12]]
    h.engine.add_embedding("e", inputs, user="ann")
    h.run()
    events = _events(h, "e")
    assert [type(e) for e in events] == [Embedded, Done]
    vectors = np.array(events[0].vectors)
    assert vectors.shape == (4, h.runner.n_embd)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose(vectors[3], fake_vector([11, 12], h.runner.n_embd), atol=1e-6)
    done = events[1]
    assert (done.finish_reason, done.prompt_tokens, done.completion_tokens) == ("stop", 17, 0)
    assert done.cached_tokens == 0 and done.timings["itl_ms"] is None
    assert done.timings["queue_ms"] is not None and done.timings["e2e_ms"] > 0
    assert 0 < done.timings["ttft_ms"] <= done.timings["e2e_ms"]
    snap = h.engine.snapshot().result()
    assert (snap.counters.embed_requests, snap.counters.embed_inputs) == (1, 4)
    assert snap.counters.embed_tokens == 17 and snap.counters.finished == 0


@pytest.mark.parametrize(
    ("inputs", "match"),
    [
        ([], "without inputs"),
        ([[11], []], "input 1 is empty"),
        ([[11]] * 2049, "too_many_inputs"),
        ([[11] * 513], "too_long"),
        ([[11, -1]], "outside"),
        ([[11, 1000]], "outside"),
    ],
)
def test_inputs_the_engine_does_not_take_are_refused(make_harness, inputs, match):
    h = make_harness()
    with pytest.raises(ValueError, match=match):
        h.engine.add_embedding("e", inputs)
    assert not h.engine.scheduler.has_work


def test_a_duplicate_id_is_refused_across_chats_and_embeddings(make_harness):
    h = make_harness()
    h.add("x", 4)
    with pytest.raises(ValueError, match="duplicate"):
        h.engine.add_embedding("x", [[11]])
    h.engine.add_embedding("y", [[11]])
    with pytest.raises(ValueError, match="duplicate"):
        h.engine.add_embedding("y", [[12]])


def test_a_chat_to_an_embedding_only_model_is_refused(make_harness):
    h = make_harness(is_embedding_only=True)
    with pytest.raises(ValueError, match="^embedding_only: "):
        h.add("c", 4)
    h.engine.add_embedding("e", [[11, 12]])
    h.run()
    assert h.done("e").finish_reason == "stop"


def test_cancel_while_waiting_and_midway(make_harness):
    h = make_harness(max_embed_step_inputs=4)
    h.engine.add_embedding("a", _inputs(20, 5), user="ann")
    h.engine.step()  # 4 of its 20 inputs
    h.engine.add_embedding("b", _inputs(2, 5), user="bob")
    h.engine.cancel("a")
    h.engine.cancel("b")
    h.run()
    for rid in ("a", "b"):
        assert [type(e) for e in _events(h, rid)] == [Done]
        assert h.done(rid).finish_reason == "cancelled"
    assert h.done("a").prompt_tokens == 100  # all its inputs' tokens, as the spec says
    assert h.runner.embed_calls == [[5] * 4]  # nothing after the cancel
    assert h.engine.snapshot().result().counters.embed_cancellations == 2


def test_a_failed_embedding_decode_fails_only_its_requests(make_harness):
    h = make_harness(failing_embed_token=999)
    h.add("chat", 8, max_tokens=20)
    h.engine.step()
    h.engine.add_embedding("bad", [[11, 999]], user="bob")
    h.run()
    assert h.done("bad").finish_reason == "error" and "embedding failed" in h.done("bad").error
    assert not any(isinstance(e, Embedded) for e in h.events)
    assert h.done("chat").finish_reason == "length" and h.done("chat").completion_tokens == 20
    h.engine.add_embedding("good", [[11, 12]], user="bob")
    h.run()
    assert h.done("good").finish_reason == "stop"
    h.assert_drained()


def test_inputs_spread_over_steps_within_the_embedding_context_limits(make_harness):
    h = make_harness(max_embed_tokens=100, max_embed_step_inputs=8)
    h.engine.add_embedding("e", _inputs(30, 30), user="ann")
    h.run()
    calls = h.runner.embed_calls
    assert len(calls) > 1 and sum(map(len, calls)) == 30
    assert all(sum(c) <= 100 and len(c) <= 8 for c in calls)
    assert [30, 30, 30] in calls  # as much as fits (once its price is known): whole inputs only
    assert len(h.done("e").__class__.__name__) and len(_events(h, "e")[0].vectors) == 30


def _stream(h, n: int) -> None:
    for i in range(n):
        h.add(f"s{i}", 8, max_tokens=400, user=f"s{i}")
    for _ in range(3):
        h.engine.step()


def test_streams_decode_every_step_and_steps_stay_near_the_itl_target(make_harness):
    config = SchedulerConfig(itl_target_ms=120)
    h = make_harness(config)
    _stream(h, 4)
    h.engine.add_embedding("big", _inputs(300, 20), user="emb")
    first = len(h.runner.steps)
    times = []
    for _ in range(1000):
        if h.done("big") is not None:
            break
        before = h.runner.clock.now
        h.engine.step()
        times.append(h.runner.clock.now - before)
    assert h.done("big").finish_reason == "stop"
    steps = h.runner.steps[first:]
    assert all(s.num_decode == 4 for s in steps)  # every stream got its token every step
    assert len(h.runner.embed_calls) == len(times) and len(times) > 20
    assert max(times[3:]) <= 0.120 * 1.1  # once the embedding price is measured


def test_a_user_with_many_inputs_does_not_hold_back_another(make_harness):
    h = make_harness(SchedulerConfig(itl_target_ms=120))
    _stream(h, 2)
    h.engine.add_embedding("many", _inputs(2000, 20), user="ann")
    for _ in range(5):
        h.engine.step()
    h.engine.add_embedding("one", [[11, 12, 13]], user="bob")
    steps = 0
    while h.done("one") is None and steps < 100:
        h.engine.step()
        steps += 1
    assert steps <= 2
    assert h.done("many") is None


def test_an_input_longer_than_the_budget_goes_in_time_and_streams_keep_going(make_harness):
    h = make_harness(SchedulerConfig(itl_target_ms=120))
    _stream(h, 4)
    h.engine.add_embedding("long", [[11] * 500], user="ann")
    first, steps = len(h.runner.steps), 0
    while h.done("long") is None and steps < 100:
        h.engine.step()
        steps += 1
    assert steps <= 20  # credit: the budget of every step it waited
    assert all(s.num_decode == 4 for s in h.runner.steps[first:])


def test_embedding_steps_teach_their_price_not_the_decode_fit(make_harness):
    h = make_harness(embed_cost=(0.0, 0.004))
    _stream(h, 2)
    for _ in range(20):
        h.engine.step()
    cost = h.engine.scheduler.cost
    decode_s = cost.predict(2, 0)
    h.engine.add_embedding("e", _inputs(200, 20), user="emb")
    for _ in range(10):
        h.engine.step()
    assert len(h.runner.embed_calls) == 10
    # the rest of each step still teaches the decode fit, and the embedding decode is not in it
    assert cost.predict(2, 0) == pytest.approx(decode_s, rel=1e-3)
    assert cost.embed_token_s == pytest.approx(0.004, rel=0.15)
    assert cost.is_measured(2, 0, 40)


def test_the_snapshot_shows_embedding_work_as_its_own_kind(make_harness):
    h = make_harness(max_embed_step_inputs=2)
    h.engine.add_embedding("a", _inputs(6, 4), user="ann")
    h.engine.add_embedding("b", _inputs(1, 4), user="ann")
    h.engine.step()
    snap = h.engine.snapshot().result()
    rows = {r.request_id: r for r in snap.embeddings}
    assert rows["a"].phase == "running" and rows["a"].inputs_done == 2
    assert (rows["a"].inputs, rows["a"].tokens, rows["a"].tokens_done) == (6, 24, 8)
    assert rows["b"].phase == "waiting" and rows["b"].user == "ann"
    assert snap.embed_tokens_per_s > 0 and snap.embed_inputs_per_s > 0
    assert snap.running == 0 and snap.waiting == 0 and not snap.seqs  # chats' counts only


def test_chats_and_embeddings_together_all_finish(make_harness):
    h = make_harness()
    _stream(h, 2)
    h.add("paste", 1500, max_tokens=4, user="p")
    h.engine.add_embedding("e", _inputs(100, 30), user="emb")
    h.run()
    assert h.done("paste").finish_reason == "length" and h.done("e").finish_reason == "stop"
    assert any(isinstance(e, Token) for e in _events(h, "paste"))
    h.assert_drained()


def test_a_new_replys_first_token_beside_an_embedding_flood_waits_one_short_step(make_harness):
    """No stream decoding, an embedding flood queued: steps of embeddings alone take at most
    twice the ITL target, and a chat that arrives gets its first token from the next step,
    which carries its prompt and only the ITL target's share of embeddings. (Unbound steps of
    a fifth of the TTFT target, and as much beside the new prompt's prefill, made each reply
    of a stream beside a flood begin a second or two late.)"""
    config = SchedulerConfig(itl_target_ms=120, ttft_target_ms=5000)
    h = make_harness(config)
    h.engine.add_embedding("flood", _inputs(2000, 20), user="emb")
    times = []
    for _ in range(8):
        before = h.runner.clock.now
        h.engine.step()
        times.append(h.runner.clock.now - before)
    assert max(times[3:]) <= 2 * 0.120 * 1.1, times  # once the embedding price is measured
    h.add("late", 8, max_tokens=4, user="bob")
    arrived = h.runner.clock.now
    while not any(isinstance(e, Token) for e in _events(h, "late")):
        h.engine.step()
    assert h.runner.clock.now - arrived <= 0.120 * 1.1 + 0.010, h.runner.clock.now - arrived
    assert h.done("flood") is None  # the flood goes on beside it
