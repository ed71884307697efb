"""Speculative decoding on the real model: n-gram drafts verified in llama.cpp's batch.

The same greedy replies with drafts on and off (token for token, but where llama.cpp's
arithmetic, which depends on the batch's shape and where the cells sit, branches a reply at a
near-tie: drafts or not, that happens), exact stop strings and counts, and a cache that agrees
with the pool after every step. The exact identity, and the sampled path's distribution, are
tested on the fake runner (tests/unit/engine/test_speculative.py). Long drafts, drafts from a
conversation's earlier turns and a constrained reply's drafts (a draft its grammar forbids is
never kept) on the real model too.
"""

from __future__ import annotations

import json

import pytest

from localserve.chat.constraints import ConstraintCompiler
from localserve.config import SchedulerConfig
from localserve.engine.budget import DraftRowCost
from localserve.engine.engine import Engine
from localserve.engine.events import Done
from localserve.engine.runner import apply_cell_ops
from localserve.engine.sampling_params import SamplingParams
from localserve.engine.speculative import NgramDrafter
from localserve.runners.grammar import Constrained
from tests.support.llama_runs import (
    PROMPTS,
    all_cells,
    count_same,
    open_runner,
    run_engine,
    texts,
)

pytestmark = pytest.mark.model

# itl_target_ms high: a loaded machine's slow steps must not keep the drafts out of the test
ON = SchedulerConfig(itl_target_ms=10_000)
OFF = SchedulerConfig(itl_target_ms=10_000, speculative="off")


@pytest.fixture(scope="module")
def runner():
    r = open_runner()
    yield r
    r.close()


def _alone(runner, prompt, params, config):
    events, engine = run_engine(runner, [("a", prompt, params, "u")], config)
    done = next(e for e in events if isinstance(e, Done))
    return texts(events).get("a", ""), done, engine.snapshot().result().counters


def _replies(runner, requests, config):
    """Each request's finished sequence (its tokens), and the engine's counters."""
    seqs = {}
    _, engine = run_engine(runner, requests, config, on_step=lambda e: seqs.update(e._seqs))
    return seqs, engine.snapshot().result().counters


def test_greedy_replies_are_the_same_with_drafts_on_and_off_but_at_near_ties(runner):
    greedy = SamplingParams(temperature=0, max_tokens=32)
    requests = [(f"p{i}", p, greedy, "u") for i, p in enumerate(PROMPTS[::2])]
    off, on, accepted = {}, {}, 0
    for request in requests:  # one at a time: the batch holds its rows only
        a, c_off = _replies(runner, [request], OFF)
        b, c_on = _replies(runner, [request], ON)
        off.update(a)
        on.update(b)
        accepted += c_on.spec_accepted_tokens
        assert c_off.spec_drafts == 0 and c_on.steps <= c_off.steps
        assert c_on.generation_tokens == c_off.generation_tokens
    # drafts ran and were kept (none without them); how many depends on the step prices this
    # machine measures (a row is drafted only where it is expected to pay): 14 to 30 here
    assert accepted >= 8
    assert count_same(runner, off, on) >= len(requests) - 1


def test_with_several_users_at_once_drafts_change_a_reply_only_at_a_near_tie(runner, monkeypatch):
    """Eight prompts of three users in one batch, drafts on and off: a reply is the same, or
    where it branches the two tokens were within the batch's own noise of each other. Draft
    rows priced as on a GPU (0.1 ms, no fixed part): on this CPU eight 32-token replies rarely
    pay for them, and what is checked here is their verification in a shared batch."""
    monkeypatch.setattr(DraftRowCost, "row_s", lambda self, b: 1e-4)
    monkeypatch.setattr(DraftRowCost, "fixed_s", 0.0)
    greedy = SamplingParams(temperature=0, max_tokens=32)
    requests = [(f"r{i}", p, greedy, f"user{i % 3}") for i, p in enumerate(PROMPTS)]
    off, c_off = _replies(runner, requests, OFF)
    on, c_on = _replies(runner, requests, ON)
    assert c_on.spec_accepted_tokens > 30 and c_on.steps <= c_off.steps
    assert c_on.generation_tokens == c_off.generation_tokens
    assert count_same(runner, off, on) >= len(requests) // 2


def test_a_stop_string_inside_a_draft_ends_the_reply_where_it_would_without(runner):
    # a count the model carries on: its drafts come from the prompt and are kept
    prompt = ", ".join(str(i % 10 + 1) for i in range(23)) + ","
    stop = "9, 10,"  # a few drafted tokens in
    params = SamplingParams(temperature=0, max_tokens=40, stop=(stop,))
    text_on, done_on, c_on = _alone(runner, prompt, params, ON)
    text_off, done_off, _ = _alone(runner, prompt, params, OFF)
    assert done_on.finish_reason == done_off.finish_reason == "stop"
    assert text_on == text_off and stop not in text_on and text_on.startswith(" 4, 5")
    assert done_on.completion_tokens == done_off.completion_tokens
    assert c_on.spec_accepted_tokens > 0


def test_the_cache_agrees_with_the_pool_after_every_drafted_step(runner):
    requests = [
        (f"r{i}", p, SamplingParams(temperature=0, max_tokens=24), f"user{i % 2}")
        for i, p in enumerate(PROMPTS[:4])
    ]
    trimmed = []

    def check(engine):
        ops = engine.kv.take_ops()
        trimmed.extend(op for op in ops if op.kind == "trim")
        apply_cell_ops(runner, ops)
        for seq in engine.scheduler.running:
            assert runner.seq_num_cells(seq.seq_id) == seq.num_computed == seq.num_cells
        assert all_cells(runner) == engine.kv.num_used == engine.kv.num_committed

    _, engine = run_engine(runner, requests, ON, on_step=check)
    c = engine.snapshot().result().counters
    assert c.spec_draft_tokens > c.spec_accepted_tokens > 0 and trimmed


# --- long drafts, the conversation's history, and a grammar (issue 52) --------------------------

PARAGRAPH = (
    "The harbour wakes before the town does. Fishing boats come in with the tide, gulls circle "
    "the market, and the first kettles boil in the cafes along the quay. By seven the streets "
    "are full of bicycles, and by eight the ferry has left for the islands."
)


def _conversation(runner, config, turns: list[str], max_tokens: int):
    """One user's turns on one engine, each turn's prompt the last turn's prompt and reply (as
    generated) and a new message: each turn's finished sequence, the engine."""
    seqs, tokens = {}, []
    engine = Engine(runner, config, on_events=lambda events: None)
    for i, text in enumerate(turns):
        if i:
            tokens = list(seqs[f"t{i - 1}"].tokens)
        tokens = tokens + runner.tokenize(text, add_special=not tokens)
        engine.add_request(f"t{i}", tokens, SamplingParams(temperature=0, max_tokens=max_tokens))
        for _ in range(1000):
            engine.step()
            seqs.update(engine._seqs)
            if not engine.scheduler.has_work:
                break
    return seqs, engine


def test_a_conversations_turns_draft_long_and_from_the_last_turn_with_the_same_replies(
    runner, monkeypatch
):
    """Draft rows priced as on a GPU (as above): whether they pay on this CPU is measured by
    the step times, which a loaded machine's noise decides (drafts of 2-3 tokens, then none:
    it failed 2 runs of 3 beside two busy loops); what is checked here is how they grow and
    where they come from."""
    monkeypatch.setattr(DraftRowCost, "row_s", lambda self, b: 1e-4)
    monkeypatch.setattr(DraftRowCost, "fixed_s", 0.0)
    turns = [
        f"{PARAGRAPH}\n\nRepeat the text above word for word:\n",
        "\n\nOnce more, the same text word for word:\n",
    ]
    off, _ = _conversation(runner, OFF, turns, 48)
    on, engine = _conversation(runner, ON, turns, 48)
    c = engine.snapshot().result().counters
    # drafts grew past the first 8 tokens while they were kept whole
    assert len(c.spec_accepted_per_position) > 8, c.spec_accepted_per_position
    assert on["t1"].drafter.parent is on["t0"].drafter  # the turn drafted from the last one
    assert c.spec_accepted_tokens > 40
    # each the same, or branched at a near-tie (count_same asserts it; drafts from the first
    # step, as at this price, branch both turns here at a near-tie)
    count_same(runner, off, on)


def test_a_constrained_reply_drafts_and_a_draft_the_grammar_forbids_is_never_kept(
    runner, monkeypatch
):
    """A grammar that takes exactly the model's own unconstrained reply with one word changed:
    drafts proposing that unconstrained reply (the model's argmax at every row) are right up
    to the word, where the draft's token is the argmax and the grammar forbids it. Every draft
    reaches the rows (the scheduler's cut to what the grammar takes is off): only each row's
    mask stands between the draft and the reply."""
    prompt = f"{PARAGRAPH}\n\nRepeat the text above word for word:\n"
    free, _, _ = _alone(runner, prompt, SamplingParams(temperature=0, max_tokens=24), OFF)
    words = free.split(" ")
    assert len(words) > 8, free
    forced = " ".join([*words[:5], "lantern", *words[6:]])
    grammar = ConstraintCompiler().compile_sync("lark", f"start: {json.dumps(forced)}")
    params = SamplingParams(temperature=0, max_tokens=40, constraint=grammar)
    unconstrained = runner.tokenize(free, add_special=False)
    prompt_len = len(runner.tokenize(prompt))

    def the_free_reply(self, tokens, k):  # the draft at each step: the unconstrained reply
        start = len(tokens) - prompt_len
        return unconstrained[start : start + k] if 0 <= start < len(unconstrained) else []

    text_off, done_off, _ = _alone(runner, prompt, params, OFF)
    monkeypatch.setattr(NgramDrafter, "propose", the_free_reply)
    monkeypatch.setattr(Constrained, "allowed_prefix", lambda self, draft: len(draft))
    text_on, done_on, c_on = _alone(runner, prompt, params, ON)
    assert text_off == forced and text_on == forced, (text_off, text_on)
    assert done_on.completion_tokens == done_off.completion_tokens
    assert c_on.spec_accepted_tokens >= 3  # the words before "lantern" came as drafts
    assert c_on.spec_draft_tokens > c_on.spec_accepted_tokens  # and "lantern" refused them
