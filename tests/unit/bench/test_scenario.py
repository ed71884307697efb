"""The four-person scenario: its plan, and one round against the live server."""

from __future__ import annotations

import asyncio
import random

import msgspec
import pytest

from localserve.bench import scenario
from localserve.bench.scenario import PEOPLE, pages, pages_slice, plan_round, play
from tests.support.waiting import async_wait_until


def test_pages_load_and_slice_deterministically_per_seed():
    paragraphs = pages()
    assert sum(len(p.split()) for p in paragraphs) > 2500
    assert sum(p.startswith("## ") for p in paragraphs) >= 5
    slices = [pages_slice(random.Random(seed), 1800) for seed in range(8)]
    assert slices == [pages_slice(random.Random(seed), 1800) for seed in range(8)]
    assert len(set(slices)) > 1
    for text in slices:
        assert 1800 <= len(text.split()) < 2200
        assert text in "\n\n".join(paragraphs)


def test_rounds_vary_but_a_seed_plays_the_same_rounds():
    def plans(seed):
        rng = random.Random(seed)
        return [plan_round(rng) for _ in range(3)]

    assert plans(1) == plans(1)
    assert plans(1) != plans(2)
    first, second = plans(1)[:2]
    assert first.asks["cleo"][0].prompt != second.asks["cleo"][0].prompt
    for plan in plans(3):
        assert set(plan.asks) == set(PEOPLE)
        ana, ben, cleo, dev = (plan.asks[p] for p in PEOPLE)
        assert len(ana) >= 3 and all(40 <= a.max_tokens <= 60 for a in ana)
        assert ben[0].ignore_eos and 300 <= ben[0].max_tokens <= 400
        assert len(cleo[0].prompt.split()) * scenario.TOKENS_PER_WORD >= 2000
        assert dev[0].pause > cleo[0].pause  # dev arrives after the paste
        assert cleo[1].continues and not cleo[0].continues  # then a follow-up on the paste
    halved = plan_round(random.Random(1), scale=0.5)
    assert halved.asks["ben"][0].max_tokens == round(plans(1)[0].asks["ben"][0].max_tokens / 2)


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
