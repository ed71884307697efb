"""Integration: embeddings on the real llama.cpp runner, the embedded Gemma GGUF standing in for
an embedding model (mean pooled: its GGUF declares no pooling type)."""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from localserve.config import SchedulerConfig
from localserve.engine.engine import Engine
from localserve.engine.events import Done, Embedded, Token
from localserve.engine.sampling_params import SamplingParams
from tests.support.llama_runs import PROMPTS, open_runner

pytestmark = pytest.mark.model

TEXTS = ["The cat sat on the mat.", "Stock markets fell sharply on Monday.", "def add(a, b):"]


@pytest.fixture(scope="module")
def runner():
    r = open_runner()
    yield r
    r.close()


def _cells(runner) -> list[int]:
    mem = runner.embedder.mem
    return [llama_cpp.llama_memory_seq_pos_max(mem, i) for i in range(runner.embedder.max_inputs)]


def test_vectors_are_unit_length_and_the_same_alone_or_batched(runner):
    info = runner.info
    assert (info.n_embd, info.pooling, info.is_embedding_only) == (640, "mean", False)
    tokens = [runner.tokenize(t) for t in TEXTS]
    alone = np.stack([runner.embed([t])[0] for t in tokens])
    others = [runner.tokenize(p) for p in PROMPTS]
    batched = runner.embed([*others[:3], tokens[0], *others[3:], tokens[1], tokens[2]])
    batched = batched[[3, 9, 10]]
    assert alone.shape == (3, 640) and alone.dtype == np.float32
    assert np.allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    assert np.all(np.sum(alone * batched, axis=1) > 0.999)  # cosine, unit vectors
    cos = alone @ alone.T
    assert cos[0, 1] < 0.99 and cos[0, 2] < 0.99 and cos[1, 2] < 0.99
    assert _cells(runner) == [-1] * runner.embedder.max_inputs  # every input's cells removed


def test_a_batch_past_the_context_limits_is_refused_not_aborted(runner):
    with pytest.raises(ValueError, match="n_batch"):
        runner.embed([[2] * 300, [2] * 300])
    with pytest.raises(ValueError, match="inputs exceed"):
        runner.embed([[2]] * 65)
    assert runner.embed([[2, 100]]).shape == (1, 640)


def test_a_chat_keeps_streaming_while_64_inputs_embed(runner):
    steps: list[list] = []  # each step's events (empty: that step said nothing)
    current: list = []
    engine = Engine(runner, SchedulerConfig(), on_events=current.extend)
    params = SamplingParams(temperature=0, max_tokens=1800, ignore_eos=True)
    engine.add_request("chat", runner.tokenize(PROMPTS[1]), params, user="ann")
    for _ in range(3):  # its prompt in, its first tokens out
        engine.step()
    inputs = [runner.tokenize(f"item {i}") for i in range(64)]  # short: CPU embeds slowly
    engine.add_embedding("emb", inputs, user="bob")
    current.clear()
    for _ in range(1700):
        engine.step()
        steps.append(current[:])
        current.clear()
        if any(isinstance(e, Done) and e.request_id == "emb" for e in steps[-1]):
            break
    events = [e for step in steps for e in step]
    embedded = next(e for e in events if isinstance(e, Embedded))
    done = next(e for e in events if isinstance(e, Done) and e.request_id == "emb")
    assert len(embedded.vectors) == 64 and done.prompt_tokens == sum(map(len, inputs))
    # every step until the embedding was done gave the chat a token
    assert all(any(isinstance(e, Token) and e.request_id == "chat" for e in s) for s in steps)
    assert len(steps) > 3  # the 64 inputs were spread over steps, beside the stream
    vectors = np.array(embedded.vectors)
    # the same vector as alone, within the batch-size-dependent kernels' difference (cosine)
    assert float(vectors[0] @ runner.embed([inputs[0]])[0]) > 0.999
    engine.cancel("chat")
    engine.step()
