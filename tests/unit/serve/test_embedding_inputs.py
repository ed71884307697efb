"""An embedding request's way in (localserve/serve/embedding_inputs.py, and Admission.embed in
localserve/serve/admission.py on a pool of fake runners): the bounds on count, tokens, ids and
dimensions with messages that name what broke them, a far too long text probed not tokenized
whole, texts tokenized in the prompt builder's threads (never on the event loop), the inputs'
tokens held of the quota and refused past it (ops/quotas.py), a chat to an embedding-only
model refused, the vectors cut and renormalised."""

from __future__ import annotations

import asyncio
import math
import threading

import msgspec
import pytest

from localserve.config import ServerConfig
from localserve.ops.quotas import QuotaExceeded, Quotas
from localserve.serve.door import Embedding, Refusal, Submission
from localserve.serve.embedding_inputs import (
    EmbedLimits,
    InputRefused,
    check_count,
    check_dimensions,
    fit_token_lists,
    shorten,
    tokenize_texts,
)

LIMITS = EmbedLimits(n_vocab=100, n_embd=4, max_inputs=3, max_tokens=5)


def _words(text: str) -> list[int]:
    return [1] + [len(w) for w in text.split()]


def test_token_lists_are_checked_for_ids_and_emptiness_and_cut_or_refused_past_the_bound():
    assert fit_token_lists([[1, 2], [99]], LIMITS, False) == [[1, 2], [99]]
    with pytest.raises(InputRefused, match=r"input\[1\]\[0\]: token id 100 is not in .*0 to 99"):
        fit_token_lists([[1], [100]], LIMITS, False)
    with pytest.raises(InputRefused, match=r"input\[0\]: an empty input"):
        fit_token_lists([[]], LIMITS, True)
    assert fit_token_lists([list(range(9))], LIMITS, True) == [[0, 1, 2, 3, 4]]
    with pytest.raises(InputRefused, match=r"input\[0\]: 9 tokens; .* at most 5") as refused:
        fit_token_lists([list(range(9))], LIMITS, False)
    assert refused.value.code == "too_long"


def test_count_and_dimensions_name_the_bound():
    check_count(3, 3)
    with pytest.raises(InputRefused, match="input: 4 inputs; at most 3"):
        check_count(4, 3)
    check_dimensions(None, 4)
    check_dimensions(4, 4)
    for bad in (0, 5):
        with pytest.raises(InputRefused, match="dimensions") as refused:
            check_dimensions(bad, 4)
        assert refused.value.param == "dimensions"


def test_a_far_too_long_text_is_refused_from_a_probe_of_its_head():
    seen: list[int] = []

    def tokenize(text: str) -> list[int]:
        seen.append(len(text))
        return _words(text)

    with pytest.raises(InputRefused, match=r"input\[0\]: over 15 tokens"):
        tokenize_texts(["ab " * 100_000], tokenize, 5, False)
    assert seen == [40]  # 5 tokens' worth of characters (8 a token), never the 300,000
    assert tokenize_texts(["a b c d e f g"], tokenize, 5, True) == [[1, 1, 1, 1, 1]]


def test_shorten_cuts_and_renormalises():
    vectors = [[0.5, 0.5, 0.5, 0.5]]
    assert shorten(vectors, None) is vectors and shorten(vectors, 4) is vectors
    (cut,) = shorten(vectors, 2)
    assert cut == pytest.approx([1 / math.sqrt(2)] * 2)


def test_input_tokens_are_held_of_the_quota_and_refused_past_what_is_left():
    quotas = Quotas(ServerConfig(daily_tokens=100), lambda: 1e9, {})
    first = quotas.hold("ann", 0)
    quotas.hold_inputs(first, 60)
    assert first.tokens == 60
    second = quotas.hold("ann", 0)
    with pytest.raises(QuotaExceeded, match="your 41 input tokens do not fit the 40 tokens left"):
        quotas.hold_inputs(second, 41)
    quotas.hold_inputs(second, 40)  # exactly what is left fits
    quotas.settle(first)
    quotas.settle(second)
    assert quotas.hold("ann", 0) is not None and quotas.refusal("ann") is None


# --- through admission, on a pool of fake runners --------------------------------------------


class _Sink:
    def __init__(self) -> None:
        self.is_closed, self.dones, self.vectors = False, [], []

    def on_token(self, request, text) -> None: ...
    def on_queued(self, request, position, wait_s=None) -> None: ...
    def on_done(self, request, done) -> None:
        self.dones.append(done)

    def on_embedded(self, request, vectors) -> None:
        self.vectors.append(vectors)


def _admission(embedding_only: bool = False):
    from localserve.config import Config, ModelConfig
    from localserve.ops.auth import Access
    from localserve.runners.fake import FakeRunner
    from localserve.serve.admission import Admission
    from localserve.serve.pool import LoadedModel, ModelPool

    class FakeEngine:
        on_events, problem, num_rejected = None, "", 0

        def __init__(self) -> None:
            self.embeddings: list[tuple] = []

        def reject(self) -> None:
            self.num_rejected += 1

        def add_embedding(self, request_id, inputs, user="", client_id=None) -> None:
            self.embeddings.append((request_id, inputs, user, threading.current_thread().name))

    runner = FakeRunner()
    runner.info = msgspec.structs.replace(
        runner.info, n_embd=4, max_embed_tokens=6, max_embed_inputs=3,
        is_embedding_only=embedding_only,
    )  # fmt: skip
    engine = FakeEngine()
    models = {"a": ModelConfig(path="/nowhere/a.gguf", chat_format="transcript")}
    config = Config(default="a", models=models, server=ServerConfig())
    pool = ModelPool(config, lambda: config.server, None, lambda events: None)
    pool.add_loaded("a", LoadedModel(engine, runner, lambda: None))
    admission = Admission(pool, lambda: config.server, lambda: None, Access({}))
    return admission, pool.slot("a"), engine


def test_admission_tokenizes_texts_off_the_loop_and_hands_the_engine_their_tokens():
    async def main():
        admission, slot, engine = _admission()
        loop_thread = threading.current_thread().name
        tokenized_in: list[str] = []
        tokenize = slot.prompts.tokenize

        def watched(text, add_special=True):
            tokenized_in.append(threading.current_thread().name)
            return tokenize(text, add_special)

        slot.prompts.tokenize = watched
        sink = _Sink()
        request = await admission.embed(Embedding(sink, "ann", "c1", "1:c1", ["a b", "c"]), slot)
        assert request is not None and request.is_in_engine
        ((rid, inputs, user, _),) = engine.embeddings
        assert (rid, user, [len(i) for i in inputs]) == ("1:c1", "ann", [3, 2])
        assert tokenized_in and loop_thread not in tokenized_in
        assert admission.counts.inflight_per_user == {"ann": 1}

    asyncio.run(main())


@pytest.mark.parametrize(
    "inputs, options, code, says",
    [
        (["a"] * 4, {}, "bad_request", "input: 4 inputs; at most 3"),
        (["a"] * 3000, {}, "bad_request", "input: 3000 inputs; at most 2048"),
        (["a b c d e f g"], {}, "too_long", "input[0]: 8 tokens; this model embeds at most 6"),
        ([[1, 1 << 40]], {}, "bad_request", "input[0][1]: token id 1099511627776"),
        (["a"], {"dimensions": 5}, "bad_request", "dimensions: 5 is not between 1 and"),
    ],
)
def test_admission_refuses_what_is_past_the_models_bounds_and_frees_its_place(
    inputs, options, code, says
):
    async def main():
        admission, slot, engine = _admission()
        embedding = Embedding(_Sink(), "ann", "c1", "1:c1", inputs, **options)
        with pytest.raises(Refusal) as refused:
            await admission.embed(embedding, slot)
        assert (refused.value.code, says in refused.value.message) == (code, True)
        assert engine.embeddings == [] and admission.counts.requests == {}

    asyncio.run(main())


def test_a_chat_to_an_embedding_only_model_is_a_clear_bad_request():
    from localserve.protocol.frames import SamplingFields

    async def main():
        admission, slot, _ = _admission(embedding_only=True)

        async def prompt(prompts, reply):
            raise AssertionError("no prompt is built for a chat an embedding model refuses")

        chat = Submission(_Sink(), "ann", "c1", "1:c1", SamplingFields(max_tokens=8), prompt)
        with pytest.raises(Refusal, match="a is an embedding model; it answers embeddings only"):
            await admission.submit(chat, slot)
        assert admission.counts.requests == {}

    asyncio.run(main())
