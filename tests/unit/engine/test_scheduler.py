"""Scheduling rules, each its own test, on the deterministic fake runner."""

from __future__ import annotations

from localserve.config import SchedulerConfig
from localserve.engine.events import Admitted, Preempted


def decoding_ids(h) -> set[str]:
    return {
        s.request_id for s in h.engine.scheduler.running if s.num_computed and not s.is_prefilling
    }


def test_decode_tokens_go_before_prefill(make_harness):
    h = make_harness()
    h.add("a", 8, max_tokens=50)
    h.step()  # a's prompt in one chunk
    h.add("b", 2000, max_tokens=4)
    h.step()
    last = h.runner.steps[-1]
    assert last.request_ids[0] == "a" and last.num_decode == 1
    assert last.num_prefill > 0


def test_long_prompt_is_chunked_within_max_num_batched_tokens(make_harness):
    h = make_harness(n_batch=256)
    h.add("long", 1000, max_tokens=2)
    h.run()
    prefill_steps = [s.num_prefill for s in h.runner.steps if s.num_prefill]
    assert sum(prefill_steps) == 1000
    assert len(prefill_steps) == 4 and max(prefill_steps) <= 256
    assert h.done("long").finish_reason == "length"


def test_long_prompt_never_takes_a_step_from_running_decodes(make_harness):
    # a 4,000-token paste arrives while three sequences decode
    h = make_harness(n_ctx=8192, n_batch=512)
    for rid in ("a", "b", "c"):
        h.add(rid, 20, max_tokens=200, user=rid)
    h.step()
    assert decoding_ids(h) == {"a", "b", "c"}
    h.add("paste", 4000, max_tokens=4, user="d")
    while not h.done("paste"):
        before = decoding_ids(h)
        h.step()
        step = h.runner.steps[-1]
        assert before <= set(step.request_ids), "a decoding sequence lost its step"
        assert step.num_decode >= len(before)
    assert all(h.done(r) is None for r in ("a", "b", "c")), "the paste finished after them"


def test_prefill_budget_keeps_steps_near_the_itl_target(make_harness):
    # fake cost: 10 ms + 2 ms per decode + 1 ms per prefill token; target 60 ms
    config = SchedulerConfig(itl_target_ms=60, min_prefill_tokens=8)
    h = make_harness(config, n_ctx=8192, n_batch=512)
    for rid in ("a", "b", "c"):
        h.add(rid, 10, max_tokens=300, user=rid)
    h.step()
    for _ in range(20):  # let the cost model learn decode-only steps
        h.step()
    h.add("paste", 3000, max_tokens=2, user="d")
    for _ in range(40):
        h.step()
    mixed = [s for s in h.runner.steps[-30:] if s.num_prefill and s.num_decode]
    assert mixed, "the paste was prefilled alongside the decodes"
    for s in mixed:
        step_ms = 10 + 2 * s.num_decode + 1 * s.num_prefill
        assert step_ms <= 60 * 1.15
    assert max(s.num_prefill for s in mixed) >= 30  # and it kept making real progress


def streams_and_pastes(make_harness, pastes: int, ttft_target_ms: float, size: int = 3000):
    """Three streams, then `pastes` prompts of `size` tokens; the harness once every paste has its
    first token (fake cost: 10 ms + 2 ms per decode + 1 ms per prefill token)."""
    config = SchedulerConfig(itl_target_ms=60, min_prefill_tokens=8, ttft_target_ms=ttft_target_ms)
    h = make_harness(config, n_ctx=16384, n_batch=512)
    for rid in ("a", "b", "c"):
        h.add(rid, 10, max_tokens=2000, user=rid)
    for _ in range(20):  # let the cost model learn decode-only steps
        h.step()
    for i in range(pastes):
        h.add(f"paste{i}", size, max_tokens=2000, user=f"p{i}")
    first = h.runner.clock.now
    h.step()
    while any(h.engine._seqs[f"paste{i}"].num_output_tokens == 0 for i in range(pastes)):
        h.step()
    return h, h.runner.clock.now - first


def test_one_long_prompt_never_stretches_the_streams_steps_past_the_itl_target(make_harness):
    h, took = streams_and_pastes(make_harness, 1, ttft_target_ms=500)
    assert took > 2.0  # far past its TTFT target...
    for s in h.runner.steps[20:]:  # ...and still every step within the ITL target
        assert 10 + 2 * s.num_decode + s.num_prefill <= 60 * 1.15


def test_competing_long_prompts_take_more_of_the_step_to_meet_the_ttft_target(make_harness):
    # 3,000 prompt tokens: 3 s of prefill at least, over 4 s at the ITL target's pace
    _, at_itl_pace = streams_and_pastes(make_harness, 2, ttft_target_ms=1e9, size=1500)
    h, with_target = streams_and_pastes(make_harness, 2, ttft_target_ms=3600, size=1500)
    assert at_itl_pace > 4.0 and with_target <= 3.6 * 1.05
    steps_ms = [10 + 2 * s.num_decode + s.num_prefill for s in h.runner.steps if s.num_decode]
    assert max(steps_ms) > 60 * 1.15  # the streams' steps stretched past the ITL target
    # and the steps say so (the monitor names the TTFT target as what stretches them)
    stretched = h.engine.metrics.step_stats(0).stretched_share
    assert stretched > 0.3
    h, _ = streams_and_pastes(make_harness, 1, ttft_target_ms=500)
    assert h.engine.metrics.step_stats(0).stretched_share == 0  # one paste: never stretched


def test_a_request_waiting_on_its_own_users_cap_does_not_stretch_the_streams(make_harness):
    config = SchedulerConfig(
        itl_target_ms=60, min_prefill_tokens=8, ttft_target_ms=500, max_running_per_user=3
    )
    h = make_harness(config, n_ctx=16384, n_batch=512)
    for rid in ("a", "b", "c"):
        h.add(rid, 10, max_tokens=2000, user="carol")
    h.add("waits", 10, max_tokens=4, user="carol")  # over carol's cap: faster prefill won't help
    for _ in range(20):
        h.step()
    h.add("paste", 3000, max_tokens=4, user="dave")
    for _ in range(60):
        h.step()
        s = h.runner.steps[-1]
        assert 10 + 2 * s.num_decode + s.num_prefill <= 60 * 1.15


def test_one_users_several_pastes_never_stretch_the_others_steps(make_harness):
    config = SchedulerConfig(itl_target_ms=60, min_prefill_tokens=8, ttft_target_ms=500)
    h = make_harness(config, n_ctx=16384, n_batch=512)
    for rid in ("a", "b", "c"):
        h.add(rid, 10, max_tokens=2000, user=rid)
    for _ in range(20):
        h.step()
    for i in range(3):  # one user, three pastes: far past their TTFT target
        h.add(f"paste{i}", 2000, max_tokens=4, user="mallory")
    for _ in range(100):
        h.step()
        s = h.runner.steps[-1]
        assert 10 + 2 * s.num_decode + s.num_prefill <= 60 * 1.15


def test_short_prompt_is_not_stuck_behind_a_long_prefill(make_harness):
    h = make_harness(n_ctx=8192, n_batch=256)
    h.add("paste", 4000, max_tokens=4, user="alice")
    h.step()
    h.step()
    h.add("question", 30, max_tokens=4, user="bob")
    h.step()
    assert "question" in h.runner.steps[-1].request_ids
    h.step()
    assert h.engine._seqs["question"].num_output_tokens >= 1
    assert not h.done("paste")


def test_a_new_short_prompt_has_the_prefill_of_its_step_to_itself(make_harness):
    h = make_harness(n_ctx=8192, n_batch=256)
    h.add("stream", 10, max_tokens=300, user="carol")
    h.step()
    h.add("paste", 4000, max_tokens=4, user="alice")
    h.step()
    assert h.runner.steps[-1].num_prefill > 16  # the paste advances by the budget
    h.add("q1", 30, max_tokens=4, user="bob")
    h.add("q2", 20, max_tokens=4, user="dave")
    h.step()  # the questions whole and the stream's decode; the paste waits one step
    step = h.runner.steps[-1]
    assert "paste" not in step.request_ids
    assert (step.num_decode, step.num_prefill) == (1, 30 + 20)
    h.add("q3", 30, max_tokens=4, user="erin")
    h.step()  # never two such steps in a row: the paste advances with the next question
    assert {"paste", "q3"} <= set(h.runner.steps[-1].request_ids)


def test_user_with_one_request_is_admitted_in_the_first_round(make_harness):
    config = SchedulerConfig(max_running_per_user=8)
    h = make_harness(config, n_seq_max=4)
    for i in range(10):
        h.add(f"a{i}", 10, user="alice")
    h.add("b0", 10, user="bob")
    h.step()
    admitted = [s.request_id for s in h.engine.scheduler.running]
    assert len(admitted) == 4 and "b0" in admitted


def test_per_user_cap_limits_running_sequences(make_harness):
    config = SchedulerConfig(max_running_per_user=2)
    h = make_harness(config, n_seq_max=8)
    for i in range(5):
        h.add(f"a{i}", 10, user="alice")
    h.step()
    assert len(h.engine.scheduler.running) == 2
    h.run()
    assert all(h.done(f"a{i}").finish_reason == "length" for i in range(5))


def test_out_of_cells_preempts_newest_and_everyone_completes(make_harness):
    # 512 cells; four sequences of 100 prompt tokens that each want 60 more
    config = SchedulerConfig(kv_watermark=0.0)
    h = make_harness(config, n_ctx=512, n_seq_max=4, n_batch=512)
    for i in range(4):
        h.add(f"r{i}", 100, max_tokens=60, user=f"u{i}")
    h.run()
    order = [
        (type(e).__name__, e.request_id) for e in h.events if isinstance(e, Admitted | Preempted)
    ]
    assert order[:4] == [("Admitted", f"r{i}") for i in range(4)]  # r3 is the newest
    assert order[4] == ("Preempted", "r3")  # the newest loses its cells, not an older one
    assert [rid for kind, rid in order if kind == "Preempted"] == ["r3"]
    for i in range(4):
        done = h.done(f"r{i}")
        assert done.finish_reason == "length" and done.completion_tokens == 60
    h.assert_drained()


def test_preempted_sequence_resumes_with_the_same_output(make_harness):
    ref = make_harness(n_ctx=2048, n_seq_max=4)
    ref.add("r3", 100, max_tokens=60, user="u3")
    ref.run()
    h = make_harness(SchedulerConfig(kv_watermark=0.0), n_ctx=512, n_seq_max=4)
    for i in range(4):
        h.add(f"r{i}", 100, max_tokens=60, user=f"u{i}")
    h.run()
    victims = {e.request_id for e in h.events if type(e).__name__ == "Preempted"}
    assert "r3" in victims
    assert h.text("r3") == ref.text("r3")  # the fake samples from (last token, position)


def test_cancel_mid_prefill_frees_cells_at_the_next_step(make_harness):
    h = make_harness(n_ctx=8192, n_batch=256)
    h.add("paste", 3000, max_tokens=4)
    h.step()
    h.step()
    seq = h.engine._seqs["paste"]
    assert seq.is_prefilling and h.kv.num_used == 512
    h.engine.cancel("paste")
    h.step()
    assert h.done("paste").finish_reason == "cancelled"
    h.assert_drained()
    assert h.kv.num_cached == 512  # what it computed is a cached prefix: evicted on demand


def test_cancel_while_waiting_never_runs(make_harness):
    h = make_harness(n_seq_max=1)
    h.add("a", 10, max_tokens=5)
    h.add("b", 10, max_tokens=5)
    h.engine.cancel("b")
    h.run()
    assert h.done("b").finish_reason == "cancelled" and h.done("b").completion_tokens == 0
    assert "b" not in {r for s in h.runner.steps for r in s.request_ids}


def test_static_policy_admits_nobody_until_its_batch_drains(make_harness):
    h = make_harness(SchedulerConfig(policy="static"), n_seq_max=4)
    h.add("short", 10, max_tokens=2, user="a")
    h.add("long", 10, max_tokens=30, user="b")
    h.step()
    h.add("late", 10, max_tokens=2, user="c")
    while not h.done("long"):
        h.step()
        assert "late" not in h.runner.steps[-1].request_ids
    h.run()
    assert h.done("late").finish_reason == "length"


def test_continuous_policy_admits_as_soon_as_a_slot_frees(make_harness):
    h = make_harness(n_seq_max=2)
    h.add("short", 10, max_tokens=2, user="a")
    h.add("long", 10, max_tokens=30, user="b")
    h.add("late", 10, max_tokens=2, user="c")
    for _ in range(5):
        h.step()
    assert h.done("late") is not None and h.done("long") is None


def test_finish_reasons_stop_and_length(make_harness):
    h = make_harness(eog_every=5)
    h.add("eog", 10, max_tokens=500)
    h.add("len", 10, max_tokens=3, ignore_eos=True)
    h.run()
    assert h.done("eog").finish_reason == "stop"
    assert h.done("len").finish_reason == "length"


def test_prompt_longer_than_the_context_is_refused(make_harness):
    import pytest

    h = make_harness(n_ctx=512)
    with pytest.raises(ValueError, match="too_long"):
        h.add("big", 600)


def test_sequence_stops_at_the_end_of_the_context(make_harness):
    h = make_harness(n_ctx=256)
    h.add("grow", 200, max_tokens=500)
    h.run()
    done = h.done("grow")
    assert done.finish_reason == "length" and done.prompt_tokens + done.completion_tokens == 256


def test_kv_accounting_matches_the_cache(make_harness):
    h = make_harness(n_ctx=4096, n_batch=128)
    for i in range(6):
        h.add(f"r{i}", 50 + 90 * i, max_tokens=10 + 5 * i, user=f"u{i % 3}")
    for _ in range(30):
        h.step()
        assert h.kv.num_used == h.runner.num_cells_in_use
        for seq in h.engine.scheduler.running:
            assert h.runner.seq_num_cells(seq.seq_id) == seq.num_computed <= seq.num_cells
        assert h.kv.num_used <= h.kv.num_committed <= h.kv.num_cells
    h.run()
    h.assert_drained()


def test_cache_full_in_llama_shrinks_the_pool_and_everyone_completes(make_harness):
    from localserve.engine.kv import KVPool

    h = make_harness(n_ctx=512, n_seq_max=4)  # llama.cpp has 512 cells...
    sched = h.engine.scheduler
    h.engine.kv = sched.kv = KVPool(2048, 4)  # ...the scheduler believes in 2048
    for i in range(4):
        h.add(f"r{i}", 150, max_tokens=40, user=f"u{i}")
    h.run()
    assert h.kv.num_cells < 2048
    assert all(h.done(f"r{i}").completion_tokens == 40 for i in range(4))
    assert h.runner.cells == {}


def test_prompt_that_can_never_fit_is_refused_not_retried_forever():
    from localserve.engine.kv import KVPool
    from localserve.engine.sampling_params import SamplingParams
    from localserve.engine.scheduler import Scheduler
    from localserve.engine.sequence import Sequence

    sched = Scheduler(SchedulerConfig(), KVPool(100, 2), max_num_seqs=2, max_num_batched_tokens=64)
    seq = Sequence("huge", [2] * 150, SamplingParams(temperature=0))
    sched.add(seq)
    batch = sched.schedule()
    assert batch.finished == [seq] and not batch.items
    assert seq.finish_reason == "error" and "KV cells" in seq.error
    assert not sched.has_work
