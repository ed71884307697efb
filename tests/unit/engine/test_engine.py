"""The engine thread: thread-safe entry points, events to blocking callers, faults."""

from __future__ import annotations

import pytest

from localserve.engine.budget import StepCostModel
from localserve.engine.engine import Engine
from localserve.engine.events import Done, EventRouter, Token
from localserve.engine.sampling_params import SamplingParams
from localserve.runners.fake import FakeRunner

GREEDY = SamplingParams(temperature=0, max_tokens=5)


def test_requests_from_another_thread_stream_to_their_own_queues():
    router = EventRouter()
    engine = Engine(FakeRunner(), on_events=router).start()
    try:
        queues = {rid: router.open(rid) for rid in ("a", "b")}
        for rid in queues:
            engine.add_request(rid, [2, 50, 60], GREEDY, user=rid)
        for q in queues.values():
            events = []
            while not events or not isinstance(events[-1], Done):
                events.append(q.get(timeout=5))
            assert sum(isinstance(e, Token) for e in events) == 5
            assert events[-1].finish_reason == "length"
        snap = engine.snapshot().result(timeout=5)
        assert snap.counters.finished == 2 and snap.kv_used == 0 and snap.running == 0
    finally:
        engine.stop()


def test_duplicate_request_id_is_refused_while_in_flight():
    engine = Engine(FakeRunner())
    engine.add_request("x", [2, 3], GREEDY)
    with pytest.raises(ValueError, match="duplicate"):
        engine.add_request("x", [2, 3], GREEDY)


def test_snapshot_describes_running_and_waiting_sequences():
    runner = FakeRunner(n_seq_max=1)
    engine = Engine(runner, clock=runner.clock)
    engine.add_request("a", [2] * 20, SamplingParams(temperature=0, max_tokens=50), user="ann")
    engine.add_request("b", [2] * 30, GREEDY, user="bob")
    for _ in range(3):
        engine.step()
    snap = engine.snapshot().result()
    assert [r.request_id for r in snap.seqs] == ["a"] and snap.seqs[0].phase == "decode"
    assert snap.waiting_seqs[0].request_id == "b" and snap.waiting_seqs[0].prompt_tokens == 30
    assert snap.kv_used == 22 and snap.kv_total == runner.n_ctx
    assert snap.ttft.count == 1 and snap.steps.num_steps == 3


def test_a_failing_decode_fails_only_that_batch_and_the_engine_goes_on():
    class Flaky(FakeRunner):
        fail_next = True

        def run(self, batch):
            if self.fail_next:
                self.fail_next = False
                from localserve.engine.runner import DecodeError

                raise DecodeError("llama_decode returned -3")
            return super().run(batch)

    runner = Flaky()
    events = []
    engine = Engine(runner, on_events=events.extend, clock=runner.clock)
    engine.add_request("a", [2, 3, 4], GREEDY)
    engine.step()
    engine.add_request("b", [2, 3, 4], GREEDY)
    for _ in range(10):
        engine.step()
    done = {e.request_id: e for e in events if isinstance(e, Done)}
    assert done["a"].finish_reason == "error" and "-3" in done["a"].error
    assert done["b"].finish_reason == "length"
    assert engine.kv.num_used == 0 and runner.cells == {}


def test_an_unexpected_fault_in_a_step_fails_every_running_request_and_the_engine_goes_on():
    """Not a decode error the step handles: the engine thread itself catches it."""

    class Broken(FakeRunner):
        faults = 1

        def run(self, batch):
            if self.faults:
                self.faults -= 1
                raise RuntimeError("a bug in the step")
            return super().run(batch)

    router = EventRouter()
    engine = Engine(Broken(), on_events=router)
    queues = {rid: router.open(rid) for rid in ("a", "b", "c")}
    for rid in queues:  # queued before the thread starts: one step admits all three
        engine.add_request(rid, [2, 40, 41], GREEDY, user=rid)
    engine.start()
    try:
        for q in queues.values():
            events = [q.get(timeout=10)]
            while not isinstance(events[-1], Done):
                events.append(q.get(timeout=10))
            done = events[-1]
            assert done.finish_reason == "error" and "internal error" in done.error
            assert not any(isinstance(e, Token) for e in events)
        after = router.open("after")
        engine.add_request("after", [2, 40, 41], GREEDY)  # the engine still serves
        events = [after.get(timeout=10)]
        while not isinstance(events[-1], Done):
            events.append(after.get(timeout=10))
        assert events[-1].finish_reason == "length" and events[-1].completion_tokens == 5
        engine.add_request("a", [2, 40, 41], GREEDY)  # the failed ids are free again
        snap = engine.snapshot().result(timeout=10)
        assert snap.counters.errors == 3
    finally:
        engine.stop()


def test_a_sampling_failure_fails_only_its_own_sequence(make_harness):
    h = make_harness()
    h.runner.failing_requests.add("bad")
    for rid in ("a", "bad", "b"):
        h.add(rid, 20, max_tokens=6, user=rid)
    h.run()
    bad = h.done("bad")
    assert bad.finish_reason == "error" and "sampling failed" in bad.error
    assert bad.completion_tokens == 0
    for rid in ("a", "b"):  # decoded in the same steps, untouched
        assert h.done(rid).finish_reason == "length" and h.done(rid).completion_tokens == 6
    assert h.engine.metrics.counters.errors == 1
    h.assert_drained()  # the failed sequence's cells are back in the pool


def test_a_snapshot_nobody_waits_for_any_more_harms_no_request(make_harness):
    """A monitor that disconnects while its snapshot is queued cancels the Future."""
    from concurrent.futures import Future

    from localserve.engine.client import TakeSnapshot
    from localserve.engine.engine import QueuedCommand

    h = make_harness()
    h.add("a", 20, max_tokens=6)
    h.step()
    abandoned: Future = Future()
    abandoned.cancel()
    h.engine._commands.put(QueuedCommand(TakeSnapshot(), reply=abandoned))
    h.run()
    assert h.done("a").finish_reason == "length" and h.done("a").completion_tokens == 6


def test_a_request_whose_sampler_cannot_be_made_fails_alone(make_harness):
    h = make_harness()
    real = h.runner.new_sampler

    def picky(params):
        if params.seed == 13:
            raise ValueError("no such sampler")
        return real(params)

    h.runner.new_sampler = picky
    h.add("bad", 20, seed=13)
    h.add("good", 20, max_tokens=4)
    h.run()
    assert h.done("bad").finish_reason == "error" and "no such sampler" in h.done("bad").error
    assert h.done("good").finish_reason == "length"
    h.assert_drained()


def test_a_request_preempted_in_the_step_that_admitted_it_is_counted_once(make_harness):
    from localserve.engine.kv import KVPool
    from localserve.engine.snapshot import build_snapshot

    h = make_harness(n_ctx=512, n_seq_max=4)  # llama.cpp has 512 cells...
    h.engine.kv = h.engine.scheduler.kv = KVPool(2048, 4)  # ...the scheduler believes in 2048
    h.add("a", 480, max_tokens=20, user="u0")
    h.step()  # a's prompt: 480 of the 512 cells
    h.add("b", 100, max_tokens=20, user="u1")
    h.step()  # b is admitted, the batch does not fit: b, the newest, is preempted at once
    snap = build_snapshot(h.engine)
    assert [(e.kind, e.request_id) for e in snap.events][-2:] == [
        ("admitted", "b"),
        ("preempted", "b"),
    ]
    h.run()
    snap = build_snapshot(h.engine)
    assert snap.counters.requests == 2 and snap.counters.prompt_tokens == 580
    assert snap.counters.preemptions >= 1 and snap.counters.finished == 2
    assert h.done("a").completion_tokens == h.done("b").completion_tokens == 20


def test_a_fault_sends_done_to_requests_that_finished_in_the_broken_step():
    class FailsAfterACancel(FakeRunner):
        def run(self, batch):
            if batch.finished:  # the cancelled request left in this step, then the step breaks
                raise RuntimeError("fake: broken after the scheduler finished someone")
            return super().run(batch)

    router = EventRouter()
    engine = Engine(FailsAfterACancel(), on_events=router).start()
    try:
        events = router.open("x")
        engine.add_request("x", [2, 50, 60], SamplingParams(temperature=0, max_tokens=10_000))
        while not isinstance(events.get(timeout=5), Token):
            pass
        engine.cancel("x")
        while not isinstance(done := events.get(timeout=5), Done):
            pass
        assert done.finish_reason == "cancelled"
    finally:
        engine.stop()


def test_the_engine_on_a_thread_and_in_a_process_are_both_engine_clients():
    """The server is handed either: both have every member of the EngineClient protocol."""
    from localserve.config import builtin_config
    from localserve.engine.client import EngineClient
    from localserve.engine_process.parent import EngineProcess

    assert isinstance(Engine(FakeRunner()), EngineClient)
    config = builtin_config()
    process = EngineProcess(config, config.default)  # not started: no process, no model
    try:
        assert isinstance(process, EngineClient)
    finally:
        process._step_clock.close()


def test_each_step_with_tokens_tells_what_it_carries_and_its_predicted_time():
    runner = FakeRunner()
    engine = Engine(runner, clock=runner.clock)
    told = []
    engine.expect = lambda *step: told.append(step)
    engine.add_request("a", [2] * 20, SamplingParams(temperature=0, max_tokens=3))
    for _ in range(4):
        engine.step()
    assert [(d, p) for d, p, _, _ in told] == [(0, 20), (1, 0), (1, 0)]  # the last step: none
    assert told[0][2:] == (StepCostModel().predict(0, 20), False)  # the prior's guess
    cost = engine.scheduler.cost
    assert told[2][2:] == (pytest.approx(cost.predict(1, 0), rel=0.05), True)  # measured since
