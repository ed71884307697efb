"""The four-person scenario (localserve/bench/scenario.py) against the live server: one round,
an endless one stopped, error frames counted."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from localserve.bench.scenario import PEOPLE, play
from tests.support.waiting import async_wait_until


@pytest.mark.model
def test_one_round_against_the_live_server(live):
    before = live.snapshot().counters
    # the timeout is only a safety net: a round that hangs fails here instead of at pytest's
    round_ = play(live.url, asyncio.Event(), seed=1, rounds=1, pace=0.05, scale=0.25)
    result = asyncio.run(asyncio.wait_for(round_, 300))
    assert result.rounds == 1
    assert result.errors == {}
    assert set(result.finished) <= {"stop", "length"}
    assert result.finished.total() == result.sent >= 6
    assert set(result.answered) == set(PEOPLE)
    assert result.prompt_tokens["cleo"] >= 1500  # the paste really is several pages
    assert result.cached_tokens["cleo"] >= 1500  # her follow-up reused the paste's cells
    after = live.wait_idle().counters
    assert after.finished - before.finished == result.sent
    assert after.prompt_tokens - before.prompt_tokens >= 1500


@pytest.mark.model
def test_stop_ends_an_endless_scenario_and_frees_the_server(live):
    before = live.snapshot().counters.requests

    def under_way() -> bool:  # four of its requests reached the engine
        return live.snapshot().counters.requests - before >= 4

    async def main():
        stop = asyncio.Event()
        task = asyncio.create_task(play(live.url, stop, seed=2, pace=0.05, scale=0.25))
        await async_wait_until(under_way, 120, "four requests sent")
        stop.set()
        return await asyncio.wait_for(task, 30)

    result = asyncio.run(main())
    assert result.sent >= 4
    assert result.errors == {}
    live.wait_idle()


@pytest.mark.model
def test_error_frames_are_counted_and_the_round_goes_on(live):
    server = live.server
    old = server.config
    server.config = msgspec.structs.replace(old, max_tokens=16)  # longer replies: bad_request
    try:
        result = asyncio.run(
            play(live.url, asyncio.Event(), seed=3, rounds=1, pace=0.05, scale=0.25)
        )
    finally:
        server.config = old
    assert result.rounds == 1
    assert result.errors["bad_request"] >= 3  # ben, cleo and dev at least
    assert result.finished.total() + result.errors.total() == result.sent
    live.wait_idle()
