"""Constrained sampling on the fake runner: a request's grammar shapes its own row only, ends its
reply where the grammar is complete, fails that request alone, and survives preemption."""

from __future__ import annotations

from localserve.chat.constraints import ConstraintCompiler
from localserve.engine.engine import Engine
from localserve.engine.events import Done, Token
from localserve.engine.sampling_params import Constraint, SamplingParams
from localserve.runners.fake import FakeRunner

PROMPT = [2, 50, 60, 70]
WORDS = ["w12", "w13", "w14", "w15", "w16", "w17", "w18", "w19"]


def lark(words: list[str]) -> Constraint:
    rule = " ".join(f'"{w} "' for w in words)
    return ConstraintCompiler().compile_sync("lark", f"start: {rule}")


def run(engine: Engine, events: list, max_steps: int = 500, on_step=None) -> None:
    for _ in range(max_steps):
        engine.step()
        if on_step:
            on_step(engine)
        if not engine.scheduler.has_work:
            return


def texts_and_dones(events: list) -> tuple[dict[str, str], dict[str, Done]]:
    texts: dict[str, str] = {}
    dones = {}
    for e in events:
        if isinstance(e, Token):
            texts[e.request_id] = texts.get(e.request_id, "") + e.text
        elif isinstance(e, Done):
            dones[e.request_id] = e
    return texts, dones


def engine_with(requests: list[tuple[str, SamplingParams]]) -> tuple[Engine, list]:
    events: list = []
    engine = Engine(FakeRunner(), on_events=events.extend)
    for rid, params in requests:
        engine.add_request(rid, PROMPT, params, user=rid)
    return engine, events


def test_the_mask_applies_to_its_own_row_and_others_are_untouched():
    free = SamplingParams(temperature=0, max_tokens=8)
    solo, solo_events = engine_with([("free", free)])
    run(solo, solo_events)
    engine, events = engine_with(
        [
            ("free", free),
            ("json", SamplingParams(temperature=0, max_tokens=20, constraint=lark(WORDS[:3]))),
        ]
    )
    run(engine, events)
    texts, dones = texts_and_dones(events)
    assert texts["json"] == "w12 w13 w14 "
    assert dones["json"].finish_reason == "stop" and dones["json"].completion_tokens == 3
    assert texts["free"] == texts_and_dones(solo_events)[0]["free"]  # unchanged beside it


def test_a_complete_grammar_ends_the_reply_even_when_max_tokens_allows_more():
    engine, events = engine_with(
        [("j", SamplingParams(temperature=0, max_tokens=100, constraint=lark(WORDS[:1])))]
    )
    run(engine, events)
    texts, dones = texts_and_dones(events)
    assert texts["j"] == "w12 " and dones["j"].finish_reason == "stop"


def test_a_refused_grammar_fails_that_request_alone():
    bad = Constraint(kind="lark", grammar='{"grammars": "not a grammar"}')
    engine, events = engine_with(
        [
            ("bad", SamplingParams(temperature=0, max_tokens=5, constraint=bad)),
            ("ok", SamplingParams(temperature=0, max_tokens=5)),
        ]
    )
    run(engine, events)
    _, dones = texts_and_dones(events)
    assert dones["bad"].finish_reason == "error" and "response_format" in dones["bad"].error
    assert dones["ok"].finish_reason == "length" and dones["ok"].completion_tokens == 5


def test_a_preempted_request_does_not_feed_its_matcher_twice():
    engine, events = engine_with(
        [("j", SamplingParams(temperature=0, max_tokens=50, constraint=lark(WORDS)))]
    )
    preempted = []

    def preempt_once(e: Engine) -> None:
        seq = e._seqs.get("j")
        if not preempted and seq is not None and seq.num_output_tokens == 3:
            e.scheduler._preempt(seq, e.clock())  # recomputed: prompt and 3 tokens prefilled
            preempted.append(seq)

    run(engine, events, on_step=preempt_once)
    texts, dones = texts_and_dones(events)
    assert preempted and preempted[0].num_preemptions == 1
    assert texts["j"] == " ".join(WORDS) + " " and dones["j"].finish_reason == "stop"
