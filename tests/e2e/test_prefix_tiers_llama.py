"""The host tier on the real model: a conversation whose cells were evicted is copied back
from host memory (llama.cpp's per-sequence state) and goes on as if it had never left.

The same greedy continuation as a full prefill of the same prompt (token for token, but where
llama.cpp's batch- and layout-dependent arithmetic branches at a near-tie, the bound the
speculative tests use), another person's identical conversation never restored, a state
llama.cpp refuses prefilled instead, and the pool agreeing with llama.cpp's cells after every
step. The tiers' logic is tested on the fake runner (tests/unit/engine/test_prefix_tiers.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from localserve.config import SchedulerConfig
from localserve.engine.engine import Engine
from localserve.engine.events import Done
from localserve.engine.runner import apply_cell_ops
from localserve.engine.sampling_params import SamplingParams
from tests.support.llama_runs import all_cells, count_same, open_runner

pytestmark = pytest.mark.model

MIB = 1 << 20
PAGES = Path(__file__).parents[2] / "localserve" / "bench" / "data" / "pages.md"
# no drafts, a generous ITL target: the schedule is the same whatever the machine's load
CONFIG = SchedulerConfig(itl_target_ms=10_000, speculative="off")
GREEDY = SamplingParams(temperature=0, max_tokens=24)


@pytest.fixture(scope="module")
def runner():
    r = open_runner()  # 2,048 cells
    yield r
    r.close()


@pytest.fixture(scope="module")
def text(runner) -> list[int]:
    return runner.tokenize(PAGES.read_text())


def engine_on(runner, host_cache_bytes: int = 0) -> Engine:
    events: list = []
    engine = Engine(runner, CONFIG, on_events=events.extend, host_cache_bytes=host_cache_bytes)
    engine.events = events
    return engine


def turn(engine: Engine, rid: str, tokens: list[int], user: str):
    """Run one request to its end, checking the pool against llama.cpp after every step;
    returns its sequence (prompt and reply tokens) and its Done."""
    engine.add_request(rid, tokens, GREEDY, user=user)
    engine.step()
    seq = engine._seqs[rid]
    runner = engine.runner
    for _ in range(2000):
        engine.step()
        apply_cell_ops(runner, engine.kv.take_ops())
        for s in engine.scheduler.running:
            assert runner.seq_num_cells(s.seq_id) == s.num_computed
        assert all_cells(runner) == engine.kv.num_used
        if not engine.scheduler.has_work:
            break
    done = next(e for e in engine.events if isinstance(e, Done) and e.request_id == rid)
    assert done.finish_reason in ("length", "stop"), done
    return seq, done


def evicted_conversation(engine: Engine, text: list[int]) -> list[int]:
    """Alice's first turn, then Carol's long prompt, which needs alice's cells: her next
    prompt (the history and a question) is returned, her prefix only in the host tier."""
    seq, _ = turn(engine, "alice-1", text[:900], "alice")
    turn(engine, "carol-1", text[1000:2300], "carol")
    assert not [p for p in engine.kv.prefixes if p.owner == "alice"]
    return seq.tokens[:-1] + text[950:970]


def test_a_restored_conversation_goes_on_as_a_full_prefill_of_it_would(runner, text):
    engine = engine_on(runner, host_cache_bytes=256 * MIB)
    prompt = evicted_conversation(engine, text)
    saved = [e for e in engine.kv.host.entries if e.owner == "alice"]
    assert saved and saved[0].data and len(saved[0].data) > 1_000 * len(saved[0].tokens)
    restored, done = turn(engine, "alice-2", prompt, "alice")
    assert done.cached_tokens >= len(prompt) - 21  # all but the new question came back
    assert engine.kv.host.counters.hits == 1 and engine.kv.host.counters.failures == 0
    control = engine_on(runner)  # the same prompt prefilled whole, no tier
    prefilled, control_done = turn(control, "alice-2", prompt, "alice")
    assert control_done.cached_tokens == 0
    # the same reply, or one that branches where two tokens were within the arithmetic's noise
    count_same(runner, {"a": prefilled}, {"a": restored})


def test_another_persons_identical_conversation_is_never_restored(runner, text):
    engine = engine_on(runner, host_cache_bytes=256 * MIB)
    prompt = evicted_conversation(engine, text)
    _, done = turn(engine, "bob-1", prompt, "bob")
    assert done.cached_tokens == 0 and engine.kv.host.counters.hits == 0


def test_a_state_llama_cpp_refuses_is_prefilled_instead(runner, text):
    engine = engine_on(runner, host_cache_bytes=256 * MIB)
    prompt = evicted_conversation(engine, text)
    saved = next(e for e in engine.kv.host.entries if e.owner == "alice")
    saved.data = saved.data[: len(saved.data) // 2]  # a truncated state: llama.cpp says no
    seq, done = turn(engine, "alice-2", prompt, "alice")
    assert done.cached_tokens == 0 and done.completion_tokens > 0
    assert engine.kv.host.counters.failures == 1
    control = engine_on(runner)
    prefilled, _ = turn(control, "alice-2", prompt, "alice")
    count_same(runner, {"a": prefilled}, {"a": seq})
