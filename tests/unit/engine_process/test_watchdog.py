"""The watchdog's verdict on one look at the serving engine (localserve/engine_process/watchdog.py,
`watchdog_verdict`): one test per verdict, at its boundaries, on times the test chooses."""

from __future__ import annotations

import signal

from localserve.engine_process import watchdog
from localserve.engine_process.step_clock import COLD_FACTOR, STEP_FACTOR, StepReading
from localserve.engine_process.watchdog import WatchTimes, exit_reason, watchdog_verdict

TIMEOUT = 10.0  # step_timeout_s
NOW = 1000.0
IDLE = StepReading(0.0, 0.0, 0, 0, True, 1.0)  # no step runs
JUST_HEARD = WatchTimes(heard=NOW, quiet_since=NOW, pinged=NOW, checked=NOW)


def running(for_s: float, expected_s: float = 0.5, measured: bool = True) -> StepReading:
    """A step that started `for_s` before NOW, expected to take `expected_s`."""
    return StepReading(NOW - for_s, expected_s, 4, 60, measured, 1.0)


def quiet(for_s: float, pinged_ago: float = 0.0, checked_ago: float = 0.0) -> WatchTimes:
    """Nothing heard and no step seen for `for_s`; pinged and checked that long ago."""
    return WatchTimes(NOW - for_s, NOW - for_s, NOW - pinged_ago, NOW - checked_ago)


def test_a_reader_fault_stops_the_engine_first():
    seen = watchdog_verdict(NOW, running(999), TIMEOUT, JUST_HEARD, "reader failed", -9)
    assert seen == watchdog.Verdict("fault", "reader failed")


def test_an_exited_process_stops_the_engine_with_its_exit_in_words():
    seen = watchdog_verdict(NOW, running(1), TIMEOUT, JUST_HEARD, exit_code=-signal.SIGKILL)
    assert seen.kind == "exited" and seen.reason == "the engine process was killed (SIGKILL)"
    assert exit_reason(-signal.SIGABRT) == "llama.cpp aborted the engine process (SIGABRT)"
    assert exit_reason(3) == "the engine process exited with status 3"
    assert exit_reason(0) == "the engine process exited with status 0"
    assert exit_reason(None) == "the engine process stopped answering"


def test_a_step_overruns_just_past_its_limit():
    limit = TIMEOUT + STEP_FACTOR * 0.5  # a measured step's: step_timeout_s + 3 x expected
    at_limit = watchdog_verdict(NOW, running(limit), TIMEOUT, JUST_HEARD)
    assert at_limit.kind == "stepping" and at_limit.reason == ""
    past = watchdog_verdict(NOW, running(limit + 0.01), TIMEOUT, JUST_HEARD)
    assert past.kind == "overran"
    assert past.reason.startswith(f"a step took longer than {limit:.3g} s: step_timeout_s 10")
    assert past.reason.endswith(
        "for 60 prompt and 4 decode tokens, so the engine process was stopped"
    )


def test_a_step_not_measured_yet_has_the_cold_limit():
    cold = COLD_FACTOR * TIMEOUT + STEP_FACTOR * 0.5
    inside = watchdog_verdict(NOW, running(cold, measured=False), TIMEOUT, JUST_HEARD)
    assert inside.kind == "stepping"
    past = watchdog_verdict(NOW, running(cold + 0.01, measured=False), TIMEOUT, JUST_HEARD)
    assert past.kind == "overran" and "no step like it measured yet" in past.reason


def test_a_running_step_is_not_judged_by_the_silence():
    """However long nothing was heard, a step within its limit only runs: no ping, no check."""
    seen = watchdog_verdict(NOW, running(1), TIMEOUT, quiet(10 * watchdog.SILENCE_S, 99, 99))
    assert seen == watchdog.Verdict("stepping")


def test_an_idle_engine_silent_past_silence_s_is_stopped():
    at = watchdog_verdict(NOW, IDLE, TIMEOUT, quiet(watchdog.SILENCE_S))
    assert at.kind == "idle"
    past = watchdog_verdict(NOW, IDLE, TIMEOUT, quiet(watchdog.SILENCE_S + 0.5))
    assert past.kind == "silent"
    assert past.reason == "the engine process stopped answering (silent for 6 s while idle)"


def test_the_silence_counts_from_the_later_of_heard_and_last_step():
    times = WatchTimes(heard=NOW - 60, quiet_since=NOW - 1, pinged=NOW, checked=NOW)
    assert watchdog_verdict(NOW, IDLE, TIMEOUT, times).kind == "idle"
    times = WatchTimes(heard=NOW - 1, quiet_since=NOW - 60, pinged=NOW, checked=NOW)
    assert watchdog_verdict(NOW, IDLE, TIMEOUT, times).kind == "idle"


def test_a_quiet_idle_engine_is_pinged_past_heartbeat_s_once_a_heartbeat():
    beat = watchdog.HEARTBEAT_S
    assert not watchdog_verdict(NOW, IDLE, TIMEOUT, quiet(beat, pinged_ago=99)).ping
    assert watchdog_verdict(NOW, IDLE, TIMEOUT, quiet(beat + 0.01, pinged_ago=99)).ping
    # pinged a heartbeat ago at most: not again yet
    assert not watchdog_verdict(NOW, IDLE, TIMEOUT, quiet(beat + 0.01, pinged_ago=beat)).ping
    assert watchdog_verdict(NOW, IDLE, TIMEOUT, quiet(beat + 0.01, beat + 0.01)).ping


def test_an_idle_engine_has_its_workers_checked_once_each_worker_check_s():
    check = watchdog.WORKER_CHECK_S
    assert not watchdog_verdict(NOW, IDLE, TIMEOUT, quiet(check, checked_ago=99)).check_workers
    assert watchdog_verdict(NOW, IDLE, TIMEOUT, quiet(check + 0.01, checked_ago=99)).check_workers
    # checked within WORKER_CHECK_S, or a step seen within it: not yet
    late = quiet(check + 0.01, checked_ago=check)
    assert not watchdog_verdict(NOW, IDLE, TIMEOUT, late).check_workers
    just_stepped = WatchTimes(heard=NOW - 99, quiet_since=NOW - 0.5, pinged=NOW, checked=NOW - 99)
    assert not watchdog_verdict(NOW, IDLE, TIMEOUT, just_stepped).check_workers


def test_an_engine_just_heard_is_well():
    assert watchdog_verdict(NOW, IDLE, TIMEOUT, JUST_HEARD) == watchdog.Verdict("idle")
