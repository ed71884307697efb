"""Integration: the engine on the real llama.cpp runner with the real default model."""

from __future__ import annotations

import pytest

from localserve.config import ModelConfig, SchedulerConfig
from localserve.engine import Done, Engine, Preempted, Token
from localserve.kv import KVPool
from localserve.models import ensure_embedded
from localserve.scheduler import Batch, BatchItem
from localserve.sequence import SamplingParams, Sequence

pytestmark = pytest.mark.model

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "The three primary colours are",
    "Water boils at",
    "A haiku about autumn:",
    "List of planets in the solar system: Mercury,",
    "In 1969, the first person to walk on the Moon was",
]


@pytest.fixture(scope="module")
def runner():
    from localserve.llama_runner import LlamaRunner

    cfg = ModelConfig(embedded=True, chat_template="gemma", n_ctx=2048, max_num_seqs=8,
                      max_num_batched_tokens=256, n_threads=2)  # fmt: skip
    r = LlamaRunner("gemma-3-270m", ensure_embedded(), cfg)
    yield r
    r.close()


def run_engine(runner, requests, config=None, max_steps=5000, on_step=None):
    """Run (id, prompt, params, user) requests to completion; return events and the engine."""
    events = []
    engine = Engine(runner, config or SchedulerConfig(), on_events=events.extend)
    for rid, prompt, params, user in requests:
        engine.add_request(rid, runner.tokenize(prompt), params, user=user)
    for _ in range(max_steps):
        engine.step()
        if on_step:
            on_step(engine)
        if not engine.scheduler.has_work:
            break
    return events, engine


def texts(events) -> dict[str, str]:
    out: dict[str, str] = {}
    for e in events:
        if isinstance(e, Token):
            out[e.request_id] = out.get(e.request_id, "") + e.text
    return out


def all_cells(runner) -> int:
    return sum(runner.seq_num_cells(i) for i in range(runner.n_seq_max))


def test_eight_concurrent_sequences_finish_and_free_their_cells(runner):
    requests = [
        (f"r{i}", p, SamplingParams(temperature=0, max_tokens=4 + 6 * i), f"user{i % 3}")
        for i, p in enumerate(PROMPTS)
    ]

    def check_gauges(engine):
        # the scheduler's accounting equals llama.cpp's view, sequence by sequence
        for seq in engine.scheduler.running:
            assert runner.seq_num_cells(seq.seq_id) == seq.num_computed
        assert all_cells(runner) == engine.kv.num_used

    events, engine = run_engine(runner, requests, on_step=check_gauges)
    done = {e.request_id: e for e in events if isinstance(e, Done)}
    assert set(done) == {f"r{i}" for i in range(8)}
    for i in range(8):
        d = done[f"r{i}"]
        assert d.finish_reason in ("length", "stop")
        if d.finish_reason == "length":
            assert d.completion_tokens == 4 + 6 * i
    assert engine.kv.num_used == 0 and engine.kv.num_committed == 0
    assert all_cells(runner) == 0


def test_the_same_schedule_twice_gives_the_same_greedy_text(runner):
    requests = [
        (f"r{i}", p, SamplingParams(temperature=0, max_tokens=24), "u")
        for i, p in enumerate(PROMPTS[:4])
    ]
    first, _ = run_engine(runner, requests)
    second, _ = run_engine(runner, requests)
    assert texts(first) == texts(second)
    assert all(len(t) > 10 for t in texts(first).values())


@pytest.mark.parametrize("repeat_penalty", [1.0, 1.1])  # numpy sampler, llama.cpp chain
def test_seeded_sampling_is_reproducible(runner, repeat_penalty):
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=7, max_tokens=20,
                            repeat_penalty=repeat_penalty)  # fmt: skip
    requests = [("s", PROMPTS[1], params, "u")]
    first = texts(run_engine(runner, requests)[0])
    assert first == texts(run_engine(runner, requests)[0])
    assert len(first["s"]) > 10


def test_stop_string_ends_generation_and_is_not_streamed(runner):
    greedy = SamplingParams(temperature=0, max_tokens=40)
    free_text = texts(run_engine(runner, [("a", PROMPTS[3], greedy, "u")])[0])["a"]
    stop = free_text.strip().split()[2]  # a word the model is going to write
    params = SamplingParams(temperature=0, max_tokens=40, stop=(stop,))
    events, _ = run_engine(runner, [("b", PROMPTS[3], params, "u")])
    streamed = texts(events).get("b", "")
    assert stop not in streamed
    assert free_text.startswith(streamed)
    assert next(e for e in events if isinstance(e, Done)).finish_reason == "stop"


def test_decode_out_of_cells_preempts_without_losing_work():
    # the scheduler believes in 4x more cells than llama.cpp has, so llama_decode returns 1
    from localserve.llama_runner import LlamaRunner

    cfg = ModelConfig(embedded=True, n_ctx=512, max_num_seqs=4, max_num_batched_tokens=256,
                      n_threads=2)  # fmt: skip
    small = LlamaRunner("gemma-3-270m", ensure_embedded(), cfg)
    try:
        events = []
        engine = Engine(small, SchedulerConfig(), on_events=events.extend)
        engine.kv = engine.scheduler.kv = KVPool(small.n_ctx * 4, small.n_seq_max)
        params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
        for i in range(4):
            prompt = " ".join(["word"] * 190) + PROMPTS[i]
            engine.add_request(f"r{i}", small.tokenize(prompt), params, user=f"u{i}")
        for _ in range(3000):
            engine.step()
            if not engine.scheduler.has_work:
                break
        assert any(isinstance(e, Preempted) for e in events)
        done = [e for e in events if isinstance(e, Done)]
        assert len(done) == 4 and all(d.completion_tokens == 100 for d in done)
        assert all_cells(small) == 0
    finally:
        small.close()


def test_oversized_batch_is_refused_before_llama_cpp_can_abort(runner):
    kv = KVPool(runner.n_ctx, runner.n_seq_max)
    seq = Sequence("big", [2] * 300, SamplingParams(temperature=0))
    kv.admit(seq)
    batch = Batch(items=[BatchItem(seq, 0, 300, True)], num_prefill_tokens=300)
    with pytest.raises(ValueError, match="n_batch"):
        runner.run(batch)
    runner.free_seq(seq.seq_id)


def test_text_helpers(runner):
    assert runner.tokenize("Hello")[0] == 2  # BOS
    chat = runner.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert chat == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert runner.is_eog(106) and runner.is_eog(1) and not runner.is_eog(2)
    euro = runner.tokenize("€", add_special=False)
    assert b"".join(runner.piece(t) for t in euro).decode() == "€"
    assert runner.info.n_ctx == 2048 and runner.info.backend in ("CPU", "CUDA", "GPU")
