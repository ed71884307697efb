"""The step clock and the step limit's rule (localserve/engine_process/step_clock.py): both
sides in this process, on a clock the test moves."""

from __future__ import annotations

import pytest

from localserve.engine_process import step_clock
from localserve.engine_process.step_clock import StepClock

TIMEOUT = 10.0  # step_timeout_s


class Time:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    time = Time()
    monkeypatch.setattr(step_clock.time, "monotonic", time)
    clock = StepClock.create()
    clock.time = time
    yield clock
    clock.close()


def step(clock: StepClock, decode: int, prefill: int, predicted: float, took: float, measured=True):
    """One step of the engine: started, scheduled, run for `took` seconds, ended."""
    clock.watch(True)
    clock.expect(decode, prefill, predicted, measured)
    clock.time.now += took
    clock.watch(False)


def limit_of_next(clock: StepClock, decode: int, prefill: int, predicted: float, measured=True):
    clock.watch(True)
    clock.expect(decode, prefill, predicted, measured)
    return clock.read().limit_s(TIMEOUT)


def test_a_step_carries_its_tokens_and_expected_time_until_it_ends(clock):
    assert clock.read().started == 0
    clock.watch(True)
    started = clock.read()
    assert started.started == clock.time.now and started.expected_s == 0
    assert started.limit_s(TIMEOUT) == TIMEOUT  # nothing scheduled yet: step_timeout_s
    clock.expect(3, 256, 1.5, True)
    reading = clock.read()
    assert (reading.decode_tokens, reading.prefill_tokens, reading.expected_s) == (3, 256, 1.5)
    assert reading.limit_s(TIMEOUT) == TIMEOUT + 3 * 1.5
    assert "256 prompt and 3 decode tokens" in reading.describe_limit(TIMEOUT)
    clock.time.now += 1.4
    clock.watch(False)
    assert clock.read().started == 0


def test_a_decode_step_after_a_long_prefill_is_judged_by_its_own_tokens(clock):
    step(clock, 0, 512, predicted=40.0, took=42.0)  # a slow machine's long chunk, as predicted
    limit = limit_of_next(clock, 2, 0, predicted=0.05)
    assert limit < TIMEOUT + 1  # not the long chunk's scale: a frozen worker is found soon


def test_a_long_chunk_predicted_long_may_take_three_times_that(clock):
    assert limit_of_next(clock, 0, 512, predicted=30.0) == TIMEOUT + 90


def test_a_step_slower_than_predicted_raises_the_next_expectations_and_fades(clock):
    step(clock, 2, 0, predicted=1.0, took=4.0)  # the machine got 4 times slower
    assert clock.read().slowness == 4.0
    assert limit_of_next(clock, 0, 512, predicted=10.0) == pytest.approx(TIMEOUT + 3 * 40)
    clock.time.now += step_clock.SLOWNESS_HALF_LIFE_S  # forgotten by half: 1 + 3 / 2
    assert limit_of_next(clock, 0, 512, predicted=10.0) == pytest.approx(TIMEOUT + 3 * 25)


def test_a_short_step_that_takes_a_moment_longer_is_noise_not_slowness(clock):
    step(clock, 1, 0, predicted=0.005, took=0.04)  # 8 times its prediction: a hiccup
    assert clock.read().slowness == 1.0
    step(clock, 1, 0, predicted=0.005, took=0.1)  # against MIN_PREDICTED_S: twice
    assert clock.read().slowness == pytest.approx(2.0)


def test_a_step_of_a_kind_not_measured_yet_has_three_times_step_timeout_s(clock):
    limit = limit_of_next(clock, 0, 256, predicted=0.5, measured=False)
    assert limit == 3 * TIMEOUT + 3 * 0.5
    assert "no step like it measured yet" in clock.read().describe_limit(TIMEOUT)
    clock.time.now += 20  # its prediction was the prior's guess: it teaches nothing
    clock.watch(False)
    assert clock.read().slowness == 1.0


def test_a_new_engine_process_starts_from_nothing(clock):
    step(clock, 2, 0, predicted=1.0, took=4.0)
    clock.watch(True)
    clock.reset()
    reading = clock.read()
    assert (reading.started, reading.expected_s, reading.slowness) == (0, 0, 1.0)
