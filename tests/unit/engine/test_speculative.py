"""Speculative decoding: n-gram drafts, their verification, which drafts a step carries, and
the engine on the fake runner with drafts on and off (same replies, fewer steps, exact ends)."""

from __future__ import annotations

import math
from collections import Counter

import msgspec
import numpy as np
import pytest

from localserve.chat.constraints import ConstraintCompiler
from localserve.config import SchedulerConfig
from localserve.engine.batch import Sampled
from localserve.engine.draft_history import HISTORY_DEPTH, DraftHistory
from localserve.engine.engine import Engine
from localserve.engine.events import Token
from localserve.engine.sampling_params import SamplingParams
from localserve.engine.sequence import Sequence
from localserve.engine.speculative import (
    PREFILL_STRETCH,
    PRIOR_RANGE,
    Candidate,
    DraftCosts,
    DraftStats,
    Everyone,
    NgramDrafter,
    num_accepted,
    plan_drafts,
    verify_draft,
)
from localserve.runners.fake import FakeRunner
from localserve.runners.grammar import Constrained
from localserve.runners.sampling import Sampler
from tests.support.harness import Harness

OFF = SchedulerConfig(speculative="off")
ON = SchedulerConfig()
SEEDED_ON = SchedulerConfig(draft_seeded=True)  # seeded sampled requests draft too

# --- the drafter --------------------------------------------------------------------------------


def test_a_draft_is_what_followed_the_latest_earlier_occurrence_of_the_last_tokens():
    d = NgramDrafter()
    tokens = [5, 1, 2, 3, 4, 9, 1, 2, 3, 7, 8, 1, 2]
    # "1 2" occurred at 1 and 6 (and ends the sequence): the latest earlier one continues 3 7 8
    assert d.propose(tokens, 3) == [3, 7, 8]
    assert d.propose(tokens, 1) == [3]
    tokens += [3]  # "1 2 3": the longest suffix seen before wins (3-gram at 6 -> 7 8 1)
    assert d.propose(tokens, 3) == [7, 8, 1]


def test_the_longest_matching_suffix_wins_over_a_later_shorter_one():
    d = NgramDrafter()
    tokens = [1, 2, 3, 4, 50, 9, 3, 4, 60, 1, 2, 3, 4]
    # the 4-gram "1 2 3 4" occurred once, at 0 (continues 50); "3 4" more recently (-> 60)
    assert d.propose(tokens, 2) == [50, 9]


def test_no_draft_without_an_earlier_occurrence_nor_from_the_suffix_itself():
    assert NgramDrafter().propose([1, 2, 3, 4], 4) == []
    assert NgramDrafter().propose([7, 7], 4) == []  # the only "7 7" is the suffix itself
    assert NgramDrafter().propose([7, 7, 7], 4) == [7, 7, 7, 7]  # "7 7" at 0: a loop, below
    assert NgramDrafter().propose([1, 2, 1, 2], 0) == []


def test_a_text_repeating_itself_drafts_the_repetition_as_long_as_asked():
    """A suffix found p <= n tokens back: the text repeats with period p, and the draft copies
    on into what it copies (a loop of "<i>": 48 tokens a step, not 1); found further back than
    its own length, the draft is what followed it and no more."""
    loop = [5, 6, 1, 2, 3, 1, 2, 3, 1, 2, 3]
    assert NgramDrafter().propose(loop, 7) == [1, 2, 3, 1, 2, 3, 1]  # the 8-gram, 3 back
    assert NgramDrafter().propose([9, 4, 4, 4, 4, 4, 4, 4, 4, 4], 48) == [4] * 48
    # "1 2" found 4 back: longer than the suffix, no evidence of a loop: what followed it only
    assert NgramDrafter().propose([1, 2, 7, 8, 1, 2], 6) == [7, 8, 1, 2]
    # a loop longer than the longest suffix looked up (20 > 16): it agrees 20 back and more
    period = list(range(20, 40))
    assert NgramDrafter().propose([9, *period, *period], 48) == (period * 3)[:48]
    assert NgramDrafter().propose([9, 8, *period[4:], *period], 48) == period  # only 16 agree


def test_a_copying_runs_length_is_the_drafts_evidence():
    """A 16-token suffix found before, and how far back the text agrees with it: the tokens the
    reply has copied so far, as good as a run of drafts kept whole (up to 4 x the draft)."""
    prompt = list(range(100, 200))
    cases = [  # (tokens, k): draft, evidence
        (([*prompt, 7, *prompt[:30]], 8), (prompt[30:38], 30)),
        (([*prompt, 7, *prompt[:60]], 4), (prompt[60:64], 16)),  # counted up to 4 x 4
        (([*prompt, 7, 8, *prompt[50:58]], 8), (prompt[58:66], 0)),  # an 8-gram: a phrase
        (([5, 6] * 40, 8), ([5, 6] * 4, 32)),
    ]
    for (tokens, k), expected in cases:
        d = NgramDrafter()
        assert (d.propose(tokens, k), d.evidence) == expected
    # the scheduler hands it to the planner as a streak: a copying reply's first draft is long
    runner = FakeRunner(max_draft_rows=48, repeats=1)
    engine = Engine(runner, ON, on_events=lambda events: None, clock=runner.clock)
    seq = Sequence("r", [*prompt, 7, *prompt[:40]], SamplingParams(max_tokens=64))
    candidate, draft = engine.scheduler._draft_candidate(0, seq)
    assert candidate.streak == 32 and len(draft) == 8  # (4 x the 8 a first draft may carry)


def test_the_index_grows_with_the_sequence_and_matches_a_fresh_one():
    rng = np.random.default_rng(3)
    tokens = [int(t) for t in rng.integers(0, 6, 300)]
    grown = NgramDrafter()
    for n in range(2, len(tokens)):
        assert grown.propose(tokens[:n], 5) == NgramDrafter().propose(tokens[:n], 5)


def test_of_several_occurrences_the_one_agreeing_furthest_back_wins():
    # three versions of a "file": the suffix 1 2 3 4 occurs in each; the one whose text before
    # it matches the sequence's (the middle version, 70..73) is chosen over the latest (90..93)
    v = [[50, 51, 52, 53, 1, 2, 3, 4, 60], [70, 71, 72, 73, 1, 2, 3, 4, 80]]
    v.append([90, 91, 92, 93, 1, 2, 3, 4, 99])
    tokens = v[0] + v[1] + v[2] + [70, 71, 72, 73, 1, 2, 3, 4]
    assert NgramDrafter().propose(tokens, 1) == [80]
    assert NgramDrafter().propose([*tokens[:-8], 5, 1, 2, 3, 4], 1) == [99]  # a tie: latest


def test_a_conversations_next_turn_drafts_from_the_last_one_and_indexes_only_its_new_tokens():
    history = DraftHistory()
    turn1 = [2, 7, 8, 9] * 5 + [30, 31, 32, 33, 34, 35, 36]  # ... and its reply, 30..36
    first = history.drafter_for("ann", turn1)
    first.propose(turn1, 4)
    first.prompt_len = 20  # the prompt; 30..36 its reply
    history.keep("ann", first)
    assert history.drafter_for("ann", [*turn1[:20], 99]).parent is None  # asked again: no turn
    # the next turn resends the history (its reply included) and asks again
    turn2 = [*turn1, 40, 41, 30, 31]
    second = history.drafter_for("ann", turn2)
    assert second.parent is first and second.shared == len(turn1)
    assert second.propose(turn2, 3) == [32, 33, 34]
    assert second.size - first.size <= 8  # its own index: the new tokens only
    # what the earlier turn generated past what was resent is a source too
    third = history.drafter_for("ann", [*turn1[:-3], 77, 78, 33, 34])
    assert third.propose([*turn1[:-3], 77, 78, 33, 34], 2) == [35, 36]
    # another user sharing the same leading tokens gets nothing of ann's
    bob = history.drafter_for("bob", turn2)
    assert bob.parent is None and bob.propose([40, 41, 30, 31], 3) == []


def test_the_history_is_bounded_per_user_in_tokens_and_in_depth():
    history = DraftHistory(per_user=2, max_tokens=300)
    for u in range(4):
        for c in range(3):  # three conversations each: the two latest are kept
            tokens = [1000 * u + 100 * c + i for i in range(60)]
            d = history.drafter_for(f"u{u}", tokens)
            d.propose(tokens, 1)
            history.keep(f"u{u}", d)
    assert history.num_tokens <= 300
    assert history.users()[-1] == "u3" and "u0" not in history.users()  # the oldest went
    tokens, chain = [5, 6, 7, 8] * 10, None
    for turn in range(HISTORY_DEPTH + 1):  # a long conversation: indexed afresh every few turns
        tokens = [*tokens, 100 + turn, 5, 6]
        d = history.drafter_for("long", tokens)
        d.propose(tokens, 1)
        history.keep("long", d)
        assert d.depth < HISTORY_DEPTH
        chain = d
    assert chain.depth < HISTORY_DEPTH


# --- what a sequence learns ---------------------------------------------------------------------


def test_a_draft_kept_whole_doubles_the_next_ones_length_and_a_failed_one_falls_back():
    stats = DraftStats(max_cap=48)
    assert stats.cap == 8
    for want in (16, 32, 48, 48):
        stats.update(stats.cap, stats.cap)
        assert stats.cap == want
    stats.update(48, 20)  # kept 20 of 48: the next draft at most 20
    assert stats.cap == 20
    stats.update(9, 9)  # kept whole but under half the cap (the source ended): unchanged
    assert stats.cap == 20
    stats.update(10, 10)  # half of it or more, kept whole (the planner gave it less): doubles
    assert stats.cap == 40
    stats.update(48, 20)
    stats.update(20, 0)  # nothing kept: back to the start at once
    assert stats.cap == 8
    assert DraftStats(max_cap=4).cap == 4


def test_acceptance_rises_with_accepted_drafts_falls_with_rejected_and_drifts_back():
    stats = DraftStats()
    prior = stats.rate
    for _ in range(5):
        stats.update(4, 4)
    assert stats.rate > 0.85
    bad = DraftStats()
    for _ in range(8):
        bad.update(4, 0)
    assert bad.rate < 0.2
    before = bad.rate
    for _ in range(30):  # steps without drafts: back towards the prior, so it is probed again
        bad.update(0, 0)
    assert before < bad.rate < prior + 1e-9 and bad.rate > 0.4


# --- which drafts a step carries ----------------------------------------------------------------


def _costs(step_s=0.014, tokens=1, row_s=0.005, limit_s=0.12) -> DraftCosts:
    return DraftCosts(step_s, tokens, row_s, limit_s)


def test_a_sequence_whose_drafts_are_accepted_drafts_long_and_one_that_fails_not_at_all():
    good = Candidate("good", "ann", 0.95, 8)
    bad = Candidate("bad", "bob", 0.1, 8)
    plan = plan_drafts([good, bad], _costs(step_s=0.03, tokens=2), 64)
    assert plan.get("good", 0) >= 6 and "bad" not in plan


def test_drafts_back_off_by_themselves_on_a_large_batch():
    rate = 0.7
    one = plan_drafts([Candidate(0, "ann", rate, 8)], _costs(0.014, 1), 64)
    # 16 decodes in a 74 ms step: a token costs 4.6 ms of step; a 5 ms row must return more
    many = [Candidate(i, f"u{i}", rate, 8) for i in range(16)]
    crowded = plan_drafts(many, _costs(0.074, 16), 64)
    assert sum(one.values()) >= 2 and sum(crowded.values()) == 0


def test_streams_that_all_draft_stretch_the_step_one_without_a_draft_keeps_the_target():
    costs = DraftCosts(0.03, 2, 0.005, 0.1, max_stretch=math.inf)
    both = [Candidate("a", "ann", 0.99, 48), Candidate("b", "bob", 0.99, 48)]
    stretched = plan_drafts(both, costs, 128)
    assert sum(stretched.values()) > 14  # past the 100 ms a flat target allows (14 rows)
    assert abs(stretched["a"] - stretched["b"]) <= 1  # dealt evenly
    # bob's row has no draft: the step keeps the ITL target, for him
    alone = plan_drafts(both[:1], costs, 128)
    assert sum(alone.values()) == 14
    # a prompt's chunk in the step: stretched at most PREFILL_STRETCH times
    chunk = plan_drafts(both, costs._replace(max_stretch=PREFILL_STRETCH), 128)
    assert 14 < sum(chunk.values()) <= (PREFILL_STRETCH * 0.1 - 0.03) / 0.005


def test_rows_that_do_not_pay_the_steps_fixed_price_together_do_not_go_in():
    # a 12 ms step, 3 ms a row, and 13 ms for having any draft row (a one-row step on a CPU)
    fixed = 0.013

    costs = DraftCosts(
        0.012, 1, 0.003, 1.0, step_with=lambda n: 0.012 + fixed * (n > 0) + 0.003 * n
    )

    weak = Candidate("a", "ann", 0.6, 48)  # a few rows pay at 3 ms, not with the 13 ms too
    assert plan_drafts([weak], costs, 64) == {}
    copying = Candidate("a", "ann", 0.6, 48, streak=40)  # a run of 40 kept: a long draft pays
    assert plan_drafts([copying], costs, 64)["a"] >= 12
    probing = Candidate("a", "ann", 0.6, 48, probe=True)  # a probe still goes in
    assert plan_drafts([probing], costs, 64) == {"a": 1}


def test_a_run_of_kept_drafts_predicts_a_longer_draft_than_the_rate_does():
    fresh, run = Candidate("a", "ann", 0.9, 48), Candidate("a", "ann", 0.9, 48, streak=20)
    assert run.worth(20) > 0.5 > fresh.worth(20)  # (21 / 41 against 0.9^20 = 0.12)
    assert Candidate("a", "ann", 0.99, 48, streak=2).worth(10) == 0.99**10  # the higher one


def test_a_new_sequence_starts_from_everyones_recent_acceptance():
    everyone = Everyone()
    assert everyone.prior == 0.5
    for _ in range(20):
        everyone.update(16, 16)
    assert everyone.prior == PRIOR_RANGE[1]  # capped: a sequence's own drafts still decide
    assert DraftStats(48, everyone.prior).rate == PRIOR_RANGE[1]
    for _ in range(200):  # everyone's drafts fail: a newcomer starts cautious
        everyone.update(8, 0)
    assert everyone.prior == PRIOR_RANGE[0]


def test_drafts_stay_within_the_itl_target_and_the_rows_the_runner_has():
    many = [Candidate(i, f"u{i}", 0.99, 8) for i in range(8)]
    plan = plan_drafts(many, _costs(0.05, 8, row_s=0.005, limit_s=0.1), 64)
    assert sum(plan.values()) == 10  # 50 ms + 10 rows x 5 ms = the 100 ms target
    assert sum(plan_drafts(many, _costs(0.05, 8, limit_s=10), 12).values()) == 12


def test_one_users_eight_streams_get_no_more_draft_rows_than_another_users_one():
    heavy = [Candidate(("ann", i), "ann", 0.95, 8) for i in range(8)]
    light = [Candidate(("bob", 0), "bob", 0.95, 8)]
    plan = plan_drafts(heavy + light, _costs(0.06, 9, row_s=0.001, limit_s=1.0), 12)
    ann = sum(n for key, n in plan.items() if key[0] == "ann")
    assert plan[("bob", 0)] == 6 and ann == 6


def test_the_candidates_order_says_which_user_goes_first_when_rows_are_odd():
    a, b = Candidate("a", "ann", 0.9, 8), Candidate("b", "bob", 0.9, 8)
    assert plan_drafts([a, b], _costs(limit_s=1.0), 3) == {"a": 2, "b": 1}
    assert plan_drafts([b, a], _costs(limit_s=1.0), 3) == {"b": 2, "a": 1}


# --- verification -------------------------------------------------------------------------------


def _draws(tokens, eog=()):
    seq = Sequence("r", [1], SamplingParams())
    return lambda j: Sampled(seq, tokens[j], b"", tokens[j] in eog)


def test_the_agreeing_prefix_and_the_targets_own_next_token_are_kept():
    kept = verify_draft((5, 6, 7), _draws([5, 6, 9, 0]))
    assert [s.token for s in kept] == [5, 6, 9]
    assert num_accepted((5, 6, 7), kept) == 2
    whole = verify_draft((5, 6), _draws([5, 6, 8]))
    assert [s.token for s in whole] == [5, 6, 8] and num_accepted((5, 6), whole) == 2
    none = verify_draft((5, 6), _draws([4, 6, 8]))
    assert [s.token for s in none] == [4] and num_accepted((5, 6), none) == 0


def test_the_end_of_generation_inside_a_draft_ends_the_kept_tokens():
    kept = verify_draft((5, 1, 7), _draws([5, 1, 7, 8], eog={1}))
    assert [s.token for s in kept] == [5, 1]


def test_a_failed_draw_ends_the_kept_tokens():
    seq = Sequence("r", [1], SamplingParams())
    rows = [Sampled(seq, 5), Sampled(seq, error="nan")]
    kept = verify_draft((5, 6), lambda j: rows[j])
    assert len(kept) == 2 and kept[-1].error and num_accepted((5, 6), kept) == 1


def test_sampled_verification_keeps_the_target_distribution():
    """The rejection rule for a one-token draft d: accept with p(d), else a token drawn from p
    without d. Drawn with the request's own numpy sampler, temperature 1, a fixed seed."""
    p = np.array([0.3, 0.4, 0.2, 0.1])
    logits = np.log(p).astype(np.float32)
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7))
    seq = Sequence("r", [1], SamplingParams())

    def draw(j):
        return Sampled(seq, sampler.sample(logits.copy()))

    n, draft = 20_000, (0,)
    accepted, rejected = 0, Counter()
    for _ in range(n):
        kept = verify_draft(draft, draw)
        if num_accepted(draft, kept):
            accepted += 1
        else:
            rejected[kept[0].token] += 1
    # acceptance: binomial(n, 0.3) within 4 standard deviations
    assert abs(accepted - n * p[0]) < 4 * math.sqrt(n * p[0] * (1 - p[0]))
    # the rejected tokens follow p without d, renormalised: chi-square, 2 degrees of freedom
    total = sum(rejected.values())
    expected = {t: total * p[t] / (1 - p[0]) for t in (1, 2, 3)}
    chi2 = sum((rejected[t] - e) ** 2 / e for t, e in expected.items())
    assert rejected[0] == 0 and chi2 < 13.8  # p = 0.001


# --- the engine on the fake runner --------------------------------------------------------------


def _replies(config, prompts, max_tokens=24, users=None, rows=32, **runner_kw):
    runner = FakeRunner(max_draft_rows=rows, repeats=runner_kw.pop("repeats", 7), **runner_kw)
    h = Harness(runner, config)
    for i, n in enumerate(prompts):
        h.add(f"r{i}", n, max_tokens, user=(users or {}).get(i, f"user{i % 3}"))
    h.run()
    h.assert_drained()
    done = {f"r{i}": h.done(f"r{i}") for i in range(len(prompts))}
    return {rid: (h.text(rid), d.finish_reason, d.completion_tokens) for rid, d in done.items()}, h


def test_greedy_replies_are_the_same_token_for_token_with_drafts_on_and_off_in_fewer_steps():
    prompts = [12, 40, 25, 60, 33]
    off, h_off = _replies(OFF, prompts, max_tokens=40)
    on, h_on = _replies(ON, prompts, max_tokens=40)
    assert on == off
    snap = h_on.engine.snapshot().result()
    assert snap.counters.spec_drafts > 0 and snap.counters.spec_accepted_tokens > 0
    assert snap.counters.generation_tokens == sum(n for *_, n in on.values())
    assert len(h_on.runner.steps) < len(h_off.runner.steps)
    assert h_off.engine.snapshot().result().counters.spec_drafts == 0


def test_a_reply_that_repeats_its_prompt_takes_a_fraction_of_the_steps():
    off, h_off = _replies(OFF, [80], max_tokens=100, repeats=1000)
    on, h_on = _replies(ON, [80], max_tokens=100, repeats=1000)
    assert on == off
    assert len(h_on.runner.steps) < 0.4 * len(h_off.runner.steps)
    per_pos = h_on.engine.snapshot().result().counters.spec_accepted_per_position
    # drafts grew past the first 8 tokens while they were kept whole
    assert 8 < len(per_pos) <= ON.max_draft_tokens and per_pos == sorted(per_pos, reverse=True)


def test_stop_strings_eos_and_max_tokens_end_a_drafted_reply_where_they_would_without():
    prompts = [20, 31, 45]
    for kw in ({"stop": ("w500",)}, {}, {"max_tokens": 9}):
        for eog_every in (None, 37):
            cfg = dict(repeats=5, eog_every=eog_every)
            off, _ = _replies(OFF, prompts, max_tokens=kw.get("max_tokens", 30), **cfg)
            on, h = _replies(ON, prompts, max_tokens=kw.get("max_tokens", 30), **cfg)
            assert on == off, (kw, eog_every)


def test_a_stop_string_inside_an_accepted_draft_trims_the_cells_past_it():
    runner = FakeRunner(max_draft_rows=32, repeats=100)
    h = Harness(runner, ON)
    prompt = [2] + [10 + i * 3 for i in range(30)]
    stop = f"w{prompt[16]}"  # the reply repeats the prompt: this word is its 16th token
    h.engine.add_request("b", prompt, SamplingParams(max_tokens=60, temperature=0, stop=(stop,)))
    h.run()
    done = h.done("b")
    assert done.finish_reason == "stop" and done.completion_tokens == 16
    assert h.engine.snapshot().result().counters.spec_accepted_tokens >= 10
    assert not h.text("b").endswith(stop)
    # every token came from a step of its own or as a kept draft token, none counted twice
    steps = sum(isinstance(e, Token) and e.request_id == "b" for e in h.events)
    assert steps + done.timings["draft_n_accepted"] == done.completion_tokens
    h.assert_drained()  # the cached prefix holds exactly its computed tokens, as the cache


def test_drafted_replies_survive_preemption_and_cancellation_exactly():
    prompts = [60, 60, 60, 60]
    off, _ = _replies(OFF, prompts, max_tokens=50, n_ctx=300)
    on, h = _replies(ON, prompts, max_tokens=50, n_ctx=300)
    assert on == off
    assert h.engine.snapshot().result().counters.preemptions > 0
    runner = FakeRunner(max_draft_rows=32, repeats=7)
    hc = Harness(runner, ON)
    hc.add("a", 40, max_tokens=200)
    hc.add("b", 40, max_tokens=30)
    for _ in range(6):
        hc.step()
    hc.engine.cancel("a")
    hc.run()
    assert hc.done("a").finish_reason == "cancelled" and hc.done("b").finish_reason == "length"
    assert hc.done("b").completion_tokens == 30
    hc.assert_drained()


def test_usage_and_timings_count_every_token_and_say_what_the_drafts_did():
    on, h = _replies(ON, [30], max_tokens=40)
    done = h.done("r0")
    assert done.completion_tokens == 40 and len(h.text("r0").split()) == 40
    drafted, accepted = done.timings["draft_n"], done.timings["draft_n_accepted"]
    assert 0 < accepted <= drafted
    steps = h.engine.snapshot().result().steps
    assert steps.tokens_per_decode > 1.3 and 0 < steps.draft_acceptance <= 1
    tokens = sum(isinstance(e, Token) for e in h.events if e.request_id == "r0")
    assert tokens < 40  # several tokens per event where a draft was accepted


def _constrained_replies(grammar_words: list[int], prompt: list[int]):
    """Each config's (text, tokens, drafted, accepted) of a reply under a grammar of that very
    sequence of words, beside an unconstrained reply to the same prompt."""
    words = " ".join(f'"w{w} "' for w in grammar_words)
    grammar = ConstraintCompiler().compile_sync("lark", f"start: {words}")
    replies = {}
    for config in (OFF, ON):
        h = Harness(FakeRunner(max_draft_rows=32, repeats=1000), config)
        params = SamplingParams(max_tokens=len(grammar_words), temperature=0)
        constrained = msgspec.structs.replace(params, constraint=grammar)
        h.engine.add_request("json", prompt, constrained, user="a")
        h.engine.add_request("free", prompt, params, user="b")
        h.run()
        done = h.done("json")
        drafted, kept = done.timings.get("draft_n", 0), done.timings.get("draft_n_accepted", 0)
        replies[config.speculative] = (h.text("json"), done.completion_tokens, drafted, kept)
    assert h.done("free").timings["draft_n"] > 0  # beside it, the prompt's text drafts
    return replies


def test_a_grammar_constrained_reply_drafts_and_is_the_same_as_without_drafts():
    # the reply repeats its prompt, under a grammar of that very text: its drafts are right,
    # each row drawn under the mask of the tokens kept before it
    grammar_words = [10 + i % 12 for i in range(40)]
    replies = _constrained_replies(grammar_words, [2] + [10 + i % 12 for i in range(36)])
    assert replies["off"][:2] == replies[ON.speculative][:2]
    assert replies["off"][1] == 40
    assert replies[ON.speculative][2] > 20  # drafted, and kept
    assert replies[ON.speculative][3] > 20


@pytest.mark.parametrize("cut", [True, False])
def test_a_draft_the_grammar_forbids_is_never_kept(cut, monkeypatch):
    # the prompt repeats one order of the words and the model would repeat it (the drafts say
    # so), but the grammar asks for another order: the reply follows the grammar, token for
    # token as without drafts, whether the drafts are cut by the grammar first (`cut`) or only
    # verified by each row's mask
    if not cut:  # the mask alone verifies the drafts
        monkeypatch.setattr(Constrained, "allowed_prefix", lambda self, draft: len(draft))
    grammar_words = [10 + (i * 5) % 12 for i in range(40)]
    replies = _constrained_replies(grammar_words, [2] + [10 + i % 12 for i in range(36)])
    text, n, drafted, accepted = replies[ON.speculative]
    assert (text, n) == replies["off"][:2]
    assert text == "".join(f"w{w} " for w in grammar_words)
    if cut:  # only what the grammar takes was drafted (the reply's own repeats): all kept
        assert accepted == drafted
    else:
        assert drafted > 0 and accepted < drafted  # drafted against the grammar, refused


def test_no_drafts_where_the_runner_has_no_rows_for_them():
    _, h = _replies(ON, [30], rows=0)
    assert h.engine.snapshot().result().counters.spec_drafts == 0
    runner = FakeRunner(max_draft_rows=32, repeats=7, supports_prefix_reuse=False)
    assert Engine(runner, ON).scheduler.max_draft_rows == 0


@pytest.mark.parametrize("a, b, n", [(0.03, 0.001, 1), (0.01, 0.002, 1), (0.01, 0.002, 4)])
def test_drafts_that_keep_failing_fall_to_almost_none_even_where_rows_are_cheap(a, b, n):
    """A sequence whose every draft is rejected, planned step by step as the scheduler does:
    after two failed steps it only probes, at intervals that double (a GPU-like step, where
    a row costs 1/30 of it, included)."""
    stats = [DraftStats() for _ in range(n)]
    drafted = 0
    for _ in range(400):
        cands = [
            Candidate(i, f"u{i}", s.rate, 8, s.may_probe, s.backing_off)
            for i, s in enumerate(stats)
        ]
        plan = plan_drafts(cands, _costs(a + b * n, n, b, limit_s=1.0), 64)
        for i, s in enumerate(stats):
            s.update(plan.get(i, 0), 0)
        drafted += len(plan)
    assert drafted <= 12 * n  # two tries, then probes at 2, 4, ... 64 steps: about 9 each


def test_a_probe_that_is_kept_brings_the_drafts_back():
    stats = DraftStats()
    for _ in range(3):
        stats.update(4, 0)
    assert stats.backing_off
    stats.update(1, 1)
    assert not stats.backing_off and stats.probe_wait == 4


def _sampled_replies(config, seeds, repeats=6, max_tokens=12):
    """Seeded sampled replies on the fake (temperature 1): each request's tokens."""
    runner = FakeRunner(max_draft_rows=32, repeats=repeats, sampled=True, n_seq_max=16)
    events = []
    engine = Engine(runner, config, on_events=events.extend, clock=runner.clock)
    for s in seeds:
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0, top_p=1, min_p=0, seed=s)
        engine.add_request(f"r{s}", [2] + [10 + (s + j) % 50 for j in range(20)], params)
    engine.step()
    while engine.scheduler.has_work:
        engine.step()
    tokens = {f"r{s}": [] for s in seeds}
    for e in events:
        if isinstance(e, Token):
            tokens[e.request_id] += [int(w[1:]) for w in e.text.split()]
    assert all(len(t) == max_tokens for t in tokens.values())
    return tokens, engine.snapshot().result().counters


def test_seeded_sampled_replies_are_the_same_with_drafts_on_and_off():
    off, _ = _sampled_replies(OFF, range(40))
    on, counters = _sampled_replies(SEEDED_ON, range(40))
    assert on == off and counters.spec_accepted_tokens > 0


def test_a_seeded_sampled_reply_drafts_only_where_the_operator_allows_it():
    """A seed asks for the same reply each time; on real numerics a drafted step's rows differ
    in the last bits, so by default such a request does not draft (config.py)."""
    _, default = _sampled_replies(ON, range(8))
    _, allowed = _sampled_replies(SEEDED_ON, range(8))
    assert default.spec_draft_tokens == 0 and allowed.spec_accepted_tokens > 0


@pytest.mark.parametrize("position", [1, 5, 9])
def test_sampled_tokens_follow_the_same_distribution_with_drafts_on_and_off(position):
    """Different seeds on and off: the token at a position of the reply is distributed the
    same (a chi-square test of homogeneity over the tokens seen, fixed seeds). All requests
    share one prompt, so each position has one distribution."""

    def tokens_at(config, seeds):
        replies, counters = _sampled_replies(config, seeds, repeats=4, max_tokens=10)
        return Counter(t[position] for t in replies.values()), counters

    off, _ = tokens_at(OFF, [s * 50 for s in range(600)])
    on, counters = tokens_at(SEEDED_ON, [s * 50 + 30_000 for s in range(600)])
    assert counters.spec_accepted_tokens > 0
    keys = [t for t in set(off) | set(on) if off[t] + on[t] >= 10]
    chi2 = 0.0
    for t in keys:
        e = (off[t] + on[t]) / 2
        chi2 += (off[t] - e) ** 2 / e + (on[t] - e) ** 2 / e
    assert len(keys) >= 2 and chi2 < _chi2_critical(len(keys) - 1)


def _chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-square value exceeded with probability 0.001 (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_drafts_in_a_step_llama_found_no_cells_for_give_their_cells_back():
    from localserve.engine.kv import KVPool

    def replies(config):
        runner = FakeRunner(n_ctx=600, n_seq_max=4, max_draft_rows=32, repeats=1000)
        h = Harness(runner, config)
        sched = h.engine.scheduler
        h.engine.kv = sched.kv = KVPool(2048, 4)  # the scheduler believes in more cells
        for i in range(4):
            h.add(f"r{i}", 120, max_tokens=60, user=f"u{i}")
        for _ in range(2000):
            h.step()
            for seq in sched.running:  # a decoding sequence holds what it computed, no more
                assert seq.is_prefilling or seq.num_cells <= seq.num_computed + 1
            if not sched.has_work:
                break
        assert h.kv.num_cells < 2048 and h.kv.num_committed == h.kv.num_used == 0
        assert runner.cells == {}
        # a step that computed nothing taught the cost model nothing: a row's price is the fake's
        assert sched.cost.decode_token_s == pytest.approx(runner.step_cost[1], rel=0.2)
        return {f"r{i}": h.text(f"r{i}") for i in range(4)}, h

    off, _ = replies(OFF)
    on, h = replies(ON)
    assert on == off and all(len(t.split()) == 60 for t in on.values())
    assert h.engine.snapshot().result().counters.spec_accepted_tokens > 0


def test_the_itl_limit_is_the_cost_models_whole_step_not_a_flat_price_per_row():
    """A mixed step whose batch crosses into a dearer size for its prompt tokens: drafts stop
    where the model's prediction of the whole step reaches the target."""
    cand = [Candidate(0, "ann", 0.99, 8)]
    flat = plan_drafts(cand, _costs(0.100, 1, row_s=0.001, limit_s=0.12), 64)
    dear = _costs(0.100, 1, row_s=0.001, limit_s=0.12)._replace(
        step_with=lambda n: 0.100 + 0.001 * n + (0.03 if n >= 3 else 0.0)
    )
    assert sum(flat.values()) == 8 and plan_drafts(cand, dear, 64) == {0: 2}
