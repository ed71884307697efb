"""The four-person scenario's plan (localserve/bench/scenario.py); its rounds against the live
server are e2e/test_bench_scenario.py."""

from __future__ import annotations

import random

from localserve.bench import scenario
from localserve.bench.scenario import PEOPLE, pages, pages_slice, plan_round


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
