"""The llama.cpp runner's embedding context: pooled, normalised vectors on the loaded weights.

A second llama.cpp context on the same model, made at the first embedding (a chat-only server
pays nothing for it): `embeddings = True`, the GGUF's pooling type (MEAN when it declares none,
as llama-server's `--pooling mean` and Ollama pool such models), a unified cache of one step's
inputs, `n_batch = n_ubatch = n_outputs_max = max_embed_tokens` and `n_seq_max =
max_embed_step_inputs`. llama.cpp pools one vector per sequence only over the tokens of that one
ubatch, so an input is never split: a step's inputs are at most n_ubatch tokens together, each its
own sequence, and their cells are removed right after the decode (the next step starts from an
empty cache). With `embeddings = True` llama.cpp outputs every token and still computes (and
reserves) a row of logits for each: `n_outputs_max` must be at least n_batch or it aborts the
process, and that buffer (n_vocab floats per token: 512 MiB for Gemma's 262,144 tokens at 512
tokens) is most of the context's memory; its size is logged when it is made.

Tested in tests/e2e/test_llama_embed.py.
"""

from __future__ import annotations

import logging
import time

import llama_cpp
import numpy as np

from localserve.config import ModelConfig
from localserve.engine.runner import DecodeError
from localserve.runners.llama_backend import LlamaBatch

log = logging.getLogger("localserve.engine.runner")

POOLING_NAMES = {
    llama_cpp.LLAMA_POOLING_TYPE_MEAN: "mean",
    llama_cpp.LLAMA_POOLING_TYPE_CLS: "cls",
    llama_cpp.LLAMA_POOLING_TYPE_LAST: "last",
}
_POOLING_TYPES = {name: kind for kind, name in POOLING_NAMES.items()}
_FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}


def model_pooling(chat_ctx) -> int:
    """The pooling type the GGUF declares (`<arch>.pooling_type`), as llama.cpp read it into a
    context made without one: LLAMA_POOLING_TYPE_NONE for a generative model."""
    return llama_cpp.llama_pooling_type(chat_ctx)


def choose_pooling(cfg: ModelConfig, declared: int) -> int:
    """models.toml's pooling, else the GGUF's, else MEAN (a GGUF without one: a chat model)."""
    if cfg.pooling != "auto":
        return _POOLING_TYPES[cfg.pooling]
    return declared if declared in POOLING_NAMES else llama_cpp.LLAMA_POOLING_TYPE_MEAN


class EmbeddingContext:
    """The second context: `embed(inputs)` gives one unit vector per input."""

    def __init__(self, model, cfg: ModelConfig, pooling: int, max_tokens: int, n_vocab: int):
        self.model = model
        self.cfg = cfg
        self.pooling = pooling
        self.max_tokens = max_tokens  # n_batch = n_ubatch: a step's inputs, all together
        self.max_inputs = cfg.max_embed_step_inputs  # sequence ids
        self.n_vocab = n_vocab
        self.n_embd = llama_cpp.llama_model_n_embd_out(model)
        self.ctx = None

    def _open(self) -> None:
        """Create the context (the first embedding), or raise DecodeError."""
        n_threads, n_threads_batch = self.cfg.threads()
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = self.max_tokens
        p.n_batch = p.n_ubatch = self.max_tokens
        p.n_outputs_max = self.max_tokens  # every token is an output here
        p.n_seq_max = self.max_inputs
        p.kv_unified = True
        p.embeddings = True
        p.pooling_type = self.pooling
        p.n_threads, p.n_threads_batch = n_threads, n_threads_batch
        p.flash_attn_type = _FLASH_ATTN[self.cfg.flash_attn]
        p.offload_kqv = self.cfg.offload_kqv
        p.no_perf = True
        started = time.perf_counter()
        ctx = llama_cpp.llama_init_from_model(self.model, p)
        if not ctx:
            raise DecodeError("llama.cpp could not create the embedding context")
        n_batch, n_ubatch = llama_cpp.llama_n_batch(ctx), llama_cpp.llama_n_ubatch(ctx)
        if min(n_batch, n_ubatch) < self.max_tokens:  # an input must fit one ubatch
            llama_cpp.llama_free(ctx)
            raise DecodeError(f"embedding context: n_batch {n_batch}, n_ubatch {n_ubatch}")
        self.ctx, self.mem = ctx, llama_cpp.llama_get_memory(ctx)
        self._init_batch()
        logits_mib = self.max_tokens * self.n_vocab * 4 / 2**20
        log.info(
            "embedding context: %d tokens x %d inputs per step, %s pooling, %d dims; its "
            "logits buffer alone is %.0f MiB (made in %.2f s)",
            self.max_tokens,
            self.max_inputs,
            POOLING_NAMES[self.pooling],
            self.n_embd,
            logits_mib,
            time.perf_counter() - started,
        )

    def _init_batch(self) -> None:
        n = self.max_tokens
        self._b = LlamaBatch(n)
        self._batch, self._tok, self._pos = self._b.batch, self._b.tok, self._b.pos
        self._logits, self._seq = self._b.logits, self._b.seq
        self._positions = np.arange(n, dtype=np.int32)

    def embed(self, inputs: list[list[int]]) -> np.ndarray:
        """One L2-normalised vector per input, in order (float32, n_embd each). Raises
        ValueError for inputs past the context's limits (llama.cpp would abort the process),
        DecodeError when llama.cpp fails; the cache is empty again either way."""
        self._check(inputs)
        if self.ctx is None:
            self._open()
        self._fill(inputs)
        try:
            rc = llama_cpp.llama_decode(self.ctx, self._batch)  # releases the GIL
            if rc != 0:
                raise DecodeError(f"llama_decode (embeddings) returned {rc}")
            return self._vectors(len(inputs))
        finally:
            for seq_id in range(len(inputs)):  # the next step starts from an empty cache
                llama_cpp.llama_memory_seq_rm(self.mem, seq_id, -1, -1)

    def _check(self, inputs: list[list[int]]) -> None:
        num_tokens = sum(map(len, inputs))
        if num_tokens > self.max_tokens:
            raise ValueError(f"{num_tokens} embedding tokens exceed n_batch {self.max_tokens}")
        if len(inputs) > self.max_inputs:
            raise ValueError(f"{len(inputs)} inputs exceed the context's {self.max_inputs}")
        if any(not tokens for tokens in inputs):
            raise ValueError("an empty embedding input")
        if any(min(t) < 0 or max(t) >= self.n_vocab for t in inputs):
            raise ValueError("a token id outside the vocabulary")

    def _fill(self, inputs: list[list[int]]) -> None:
        n = 0
        for seq_id, tokens in enumerate(inputs):
            k = len(tokens)
            self._tok[n : n + k] = tokens
            self._pos[n : n + k] = self._positions[:k]
            self._seq[n : n + k] = seq_id
            n += k
        self._logits[:n] = 1  # llama.cpp outputs every token of an embedding batch anyway
        self._batch.n_tokens = n

    def _vectors(self, num_inputs: int) -> np.ndarray:
        out = np.empty((num_inputs, self.n_embd), dtype=np.float32)
        for seq_id in range(num_inputs):
            ptr = llama_cpp.llama_get_embeddings_seq(self.ctx, seq_id)
            if not ptr:
                raise DecodeError(f"llama.cpp gave no pooled vector for input {seq_id}")
            out[seq_id] = np.ctypeslib.as_array(ptr, shape=(self.n_embd,))
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        if not np.all(np.isfinite(norms)):
            raise DecodeError("the embedding decode gave non-finite values")
        return out / np.maximum(norms, 1e-12)

    def close(self) -> None:
        if self.ctx is not None:
            self._b.free()
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
