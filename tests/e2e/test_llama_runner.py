"""Integration: the engine on the real llama.cpp runner with the real default model."""

from __future__ import annotations

import pytest

from localserve.config import ModelConfig, SchedulerConfig
from localserve.engine.batch import Batch, BatchItem
from localserve.engine.engine import Engine
from localserve.engine.events import Done, Preempted
from localserve.engine.kv import KVPool
from localserve.engine.runner import apply_cell_ops
from localserve.engine.sampling_params import SamplingParams
from localserve.engine.sequence import Sequence
from localserve.runners.models import ensure_embedded
from localserve.serve.prompt import PREAMBLE
from tests.support.llama_runs import PROMPTS, all_cells, open_runner, run_engine, texts

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def runner():
    r = open_runner()
    yield r
    r.close()


def test_eight_concurrent_sequences_finish_and_free_their_cells(runner):
    requests = [
        (f"r{i}", p, SamplingParams(temperature=0, max_tokens=4 + 6 * i), f"user{i % 3}")
        for i, p in enumerate(PROMPTS)
    ]

    def check_gauges(engine):
        # the scheduler's accounting equals llama.cpp's view, sequence by sequence, once the
        # cell operations that would travel with the next batch are applied
        apply_cell_ops(runner, engine.kv.take_ops())
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
    kv = engine.kv  # what is left are the finished sequences, kept as cached prefixes
    assert kv.num_used == kv.num_cached == kv.num_committed == all_cells(runner)
    assert all(runner.seq_num_cells(p.seq_id) == len(p.tokens) for p in kv.prefixes)


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
    params = SamplingParams(
        temperature=0.9, top_k=40, top_p=0.95, seed=7, max_tokens=20, repeat_penalty=repeat_penalty
    )
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
    """The scheduler believes in 4x more cells than llama.cpp has, so llama_decode returns 1.

    The four ~100-token prompts fit the 512 cells; their decodes run out of cells about 30
    steps in, and at most three replies fit at once to the end: each recomputed prompt is
    short, and the test costs a fraction of whole 200-token prompts thrashing."""
    from localserve.runners.llama import LlamaRunner

    cfg = ModelConfig(
        embedded=True, n_ctx=512, max_num_seqs=4, max_num_batched_tokens=256, n_threads=2
    )
    small = LlamaRunner("gemma-3-270m", ensure_embedded(), cfg)
    try:
        events = []
        engine = Engine(small, SchedulerConfig(), on_events=events.extend)
        engine.kv = engine.scheduler.kv = KVPool(small.n_ctx * 4, small.n_seq_max)
        params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
        prompts = [small.tokenize(" ".join(["word"] * 90) + PROMPTS[i]) for i in range(4)]
        assert sum(map(len, prompts)) < small.n_ctx  # the prefills fit: the decodes run out
        for i, prompt in enumerate(prompts):
            engine.add_request(f"r{i}", prompt, params, user=f"u{i}")
        for _ in range(3000):
            engine.step()
            if not engine.scheduler.has_work:
                break
        assert any(isinstance(e, Preempted) for e in events)
        done = [e for e in events if isinstance(e, Done)]
        assert len(done) == 4 and all(d.completion_tokens == 60 for d in done)
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
    if runner.info.backend == "CPU":  # all on the CPU: no devices to list, nor in the block
        assert runner.info.devices == () and "per device" not in runner.where()


# --- prefix caching with the real model --------------------------------------------------------

TURN_1 = "\n\nUser: What is the capital of France?\nAssistant:"
TURN_2 = "\nUser: And what river flows through that city?\nAssistant:"


def test_reuse_gives_the_same_greedy_output_as_a_full_prefill(runner):
    """Turn 2 on the cells turn 1 left behind equals turn 2 prefilled from nothing."""
    greedy = SamplingParams(temperature=0, max_tokens=24)
    results = {}
    for caching in (True, False):
        config = SchedulerConfig(prefix_caching=caching)
        events = []
        engine = Engine(runner, config, on_events=events.extend)
        engine.add_request("t1", runner.tokenize(PREAMBLE + TURN_1), greedy, user="u")
        drain(engine)
        reply = texts(events)["t1"]
        second = PREAMBLE + TURN_1 + reply + TURN_2
        engine.add_request("t2", runner.tokenize(second), greedy, user="u")
        drain(engine)
        done = next(e for e in events if isinstance(e, Done) and e.request_id == "t2")
        results[caching] = (reply, texts(events)["t2"], done.cached_tokens)
    (reply, text, cached), (cold_reply, cold_text, cold_cached) = results[True], results[False]
    assert reply == cold_reply and len(text) > 10
    # Reused cells sit elsewhere in the cache and the suffix is computed in other batch shapes,
    # so the logits differ slightly (up to ~1 on this Q4 model) and greedy text may branch at a
    # near-tie later on (" The Mississippi." against " The Mississippi River." on some CPUs,
    # at the third token): the reply must begin the same way.
    assert runner.tokenize(text, False)[:2] == runner.tokenize(cold_text, False)[:2]
    assert cold_cached == 0 and cached >= len(runner.tokenize(PREAMBLE + TURN_1)) - 1


@pytest.fixture(scope="module")
def small():
    """512 cells, four running sequences, eight ids for cached prefixes."""
    from localserve.runners.llama import LlamaRunner

    cfg = ModelConfig(
        embedded=True,
        n_ctx=512,
        max_num_seqs=4,
        max_cached_prefixes=8,
        max_num_batched_tokens=256,
        n_threads=2,
    )
    r = LlamaRunner("gemma-3-270m", ensure_embedded(), cfg)
    yield r
    r.close()


def drain(engine, steps: int = 3000) -> None:
    for _ in range(steps):
        engine.step()
        if not engine.scheduler.has_work:
            return
    raise AssertionError("engine did not drain")


def test_cached_prefixes_are_evicted_before_live_sequences_with_the_real_cache(small):
    events = []
    engine = Engine(small, SchedulerConfig(kv_watermark=0.0), on_events=events.extend)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for i in range(3):  # three finished requests leave ~400 cells cached
        prompt = small.tokenize(f"{PROMPTS[i]} " + " ".join(["word"] * 110))
        engine.add_request(f"old{i}", prompt, params, user=f"u{i}")
    drain(engine)
    assert engine.kv.num_cached > 350 and len(engine.kv.prefixes) == 3
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i in range(3):  # three new users need ~480 cells
        prompt = small.tokenize(f"{PROMPTS[4 + i]} " + " ".join(["thing"] * 110))
        engine.add_request(f"new{i}", prompt, params, user=f"v{i}")
    drain(engine)
    assert not any(isinstance(e, Preempted) for e in events)
    assert engine.kv.num_evictions >= 2 and engine.kv.num_cells == small.n_ctx  # never shrank
    done = [e for e in events if isinstance(e, Done) and e.request_id.startswith("new")]
    assert len(done) == 3 and all(d.completion_tokens == 40 for d in done)


def test_a_shared_system_prompt_shares_cells_in_llama_cpp(small):
    """Three requests on one 200-token system prompt fit in 512 cells only if it is shared."""
    events = []
    engine = Engine(small, SchedulerConfig(kv_watermark=0.0), on_events=events.extend)
    system = small.tokenize(" ".join(["rule"] * 199))
    assert len(system) == 200
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    engine.add_request("first", system + small.tokenize(PROMPTS[0], False), params, "u0", 200, True)
    drain(engine)
    assert [len(p.tokens) for p in engine.kv.prefixes if p.is_system] == [200]
    for i in range(1, 4):
        tokens = system + small.tokenize(PROMPTS[i] + " " + "more " * 50, False)
        engine.add_request(f"r{i}", tokens, params, f"u{i}", 200, True)
    engine.step()
    assert len(engine.scheduler.running) == 3  # 3 x ~290 cells: fits only because 200 are shared
    for seq in engine.scheduler.running:  # each sequence sees its whole prefix in llama.cpp
        assert seq.num_system == 200 and small.seq_num_cells(seq.seq_id) == seq.num_computed
    drain(engine)
    assert not any(isinstance(e, Preempted) for e in events)
    assert engine.kv.num_cells == small.n_ctx  # llama.cpp never reported the cache full
    done = {e.request_id: e for e in events if isinstance(e, Done)}
    assert all(done[f"r{i}"].cached_tokens == 200 for i in range(1, 4))
    assert all(done[f"r{i}"].completion_tokens == 30 for i in range(1, 4))


def test_a_q8_0_kv_cache_serves_real_requests_in_half_the_memory():
    """Quantized KV cells: concurrent requests complete, the cache holds half the bytes, and
    the accounting returns to zero."""
    from localserve.runners.llama import LlamaRunner

    def load(kv: str) -> LlamaRunner:
        cfg = ModelConfig(
            embedded=True,
            n_ctx=2048,
            max_num_seqs=8,
            max_num_batched_tokens=256,
            n_threads=2,
            cache_type_k=kv,
            cache_type_v=kv,
        )
        return LlamaRunner("gemma-3-270m", ensure_embedded(), cfg)

    f16 = load("f16")
    f16_mib = f16.placement.kv_total_mib
    f16.close()
    q8 = load("q8_0")
    try:
        assert q8.placement.kv_types == ("q8_0", "q8_0") and q8.placement.flash_attn
        assert q8.placement.kv_total_mib < 0.6 * f16_mib
        assert "q8_0 cells" in q8.where()
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        requests = [(f"q{i}", p, params, f"u{i}") for i, p in enumerate(PROMPTS)]
        events, engine = run_engine(q8, requests)
        done = [e for e in events if isinstance(e, Done)]
        assert len(done) == len(PROMPTS) and all(d.completion_tokens == 24 for d in done)
        assert all(texts(events).values())
        assert engine.kv.num_committed == engine.kv.num_cached  # only cached prefixes left
    finally:
        q8.close()


@pytest.mark.parametrize("repeat_penalty", [1.0, 1.1])  # numpy sampler, llama.cpp chain
def test_a_constrained_neighbour_changes_no_token_of_a_free_request(runner, repeat_penalty):
    """The mask is its own row's: a free greedy request beside a constrained one gives the text
    it gives beside a free one (the same batch shape, the same prompts, no drafts), token for
    token — while the constrained one really writes its JSON."""
    from localserve.chat.constraints import ConstraintCompiler

    schema = {"type": "object", "properties": {"year": {"type": "integer"}}, "required": ["year"]}
    constraint = ConstraintCompiler().compile_sync("json_schema", schema)
    prompt = PROMPTS[7]
    free = SamplingParams(temperature=0, max_tokens=24, repeat_penalty=repeat_penalty)
    shaped = SamplingParams(
        temperature=0, max_tokens=24, repeat_penalty=repeat_penalty, constraint=constraint
    )
    # without drafts: a free neighbour would draft and a constrained one cannot, and the batch's
    # shape alone moves llama.cpp's arithmetic (tests/e2e/test_speculative_decoding.py)
    same_shape = SchedulerConfig(speculative="off")
    free_pair = [("a", prompt, free, "u"), ("b", prompt, free, "v")]
    beside_free = texts(run_engine(runner, free_pair, same_shape)[0])
    shaped_pair = [("a", prompt, free, "u"), ("b", prompt, shaped, "v")]
    beside_shaped = texts(run_engine(runner, shaped_pair, same_shape)[0])
    assert beside_shaped["a"] == beside_free["a"] == beside_free["b"]
    assert beside_shaped["b"].startswith('{"year":') and not beside_free["a"].startswith("{")
