"""The llama.cpp runner: one context with a unified KV cache, raw llama_batch filling, sampling.

Only the low-level API of llama-cpp-python 0.3.36 (the high-level helper classes assume
one sequence). Two conditions abort the process inside llama.cpp (more than n_batch tokens in one
decode, more logit rows than n_outputs_max); `run` checks both before every decode and raises
ValueError instead. Embeddings run on a second context of the same weights, made at the first
`embed` (localserve.runners.llama_embed).

Tested in tests/e2e/test_llama_runner.py.
"""

from __future__ import annotations

import ctypes
import logging
import time
from pathlib import Path

import llama_cpp
import numpy as np

from localserve.chat.formats import model_formats
from localserve.config import ModelConfig
from localserve.engine.batch import Batch, Sampled
from localserve.engine.runner import DecodeError, KVCacheFull, RunTimings, apply_cell_ops
from localserve.engine.sampling_params import MIN_TEMPERATURE, SamplingParams
from localserve.engine.speculative import verify_draft
from localserve.protocol.snapshot import ModelInfo
from localserve.runners import rpc
from localserve.runners.footprint import logit_rows
from localserve.runners.grammar import Constrained, GrammarEngine
from localserve.runners.llama_backend import LlamaBatch, router
from localserve.runners.llama_embed import POOLING_NAMES, EmbeddingContext, choose_pooling
from localserve.runners.llama_text import TokenText, describe_template
from localserve.runners.placement import describe, parse_log, split_devices
from localserve.runners.sampling import Sampler, SamplingError

log = logging.getLogger("localserve.engine.runner")

_FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
_KV_TYPES = {
    "f16": llama_cpp.GGML_TYPE_F16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
}
_SPLIT_MODES = {
    "none": llama_cpp.LLAMA_SPLIT_MODE_NONE,
    "layer": llama_cpp.LLAMA_SPLIT_MODE_LAYER,
    "row": llama_cpp.LLAMA_SPLIT_MODE_ROW,
}


def _model_params(cfg: ModelConfig):
    """llama.cpp's model parameters, and the tensor_split array they point to (keep it)."""
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = cfg.n_gpu_layers
    mparams.split_mode = _SPLIT_MODES[cfg.split_mode]
    mparams.main_gpu = cfg.main_gpu
    shares = None
    if cfg.tensor_split:
        n = llama_cpp.llama_max_devices()
        shares = (ctypes.c_float * n)(*cfg.tensor_split[:n])
        mparams.tensor_split = shares
    mparams.use_mmap, mparams.use_mlock = cfg.use_mmap, cfg.use_mlock
    # No repacked weight buffers: their AMX kernels die with SIGILL on VMs that report AMX in
    # cpuid without enabling its tile state (seen on the CI machines).
    mparams.use_extra_bufts = False
    return mparams, shares


class _SamplerChain:
    """A llama.cpp sampler chain (penalties need its token history)."""

    def __init__(self, ptr) -> None:
        self.ptr = ptr


class LlamaRunner(TokenText):
    """Runs batches of decode tokens and prefill chunks on one llama.cpp context."""

    def __init__(self, name: str, path: Path, cfg: ModelConfig) -> None:
        router.captured = []  # what llama.cpp says while loading: where everything went
        try:
            mparams, self._tensor_split = _model_params(cfg)
            self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
            if not self.model:
                raise ValueError(f"models.{name}.path: llama.cpp could not load {path}")
            self.vocab = llama_cpp.llama_model_get_vocab(self.model)
            self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
            self.ctx = self._new_context(name, cfg)
            self.placement = parse_log(router.captured, cfg.flash_attn)
        finally:
            router.captured = None
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_ctx = llama_cpp.llama_n_ctx(self.ctx)  # padded: read back the real values
        self.n_batch = llama_cpp.llama_n_batch(self.ctx)
        self.n_seq_max = llama_cpp.llama_n_seq_max(self.ctx)  # running + cached prefixes
        # recurrent state cannot be cut back to a prefix: no prefix reuse for those models,
        # and no drafts (rejected draft cells are trimmed)
        self.supports_prefix_reuse = not (
            llama_cpp.llama_model_is_recurrent(self.model)
            or llama_cpp.llama_model_is_hybrid(self.model)
        )
        self.max_draft_rows = cfg.draft_rows if self.supports_prefix_reuse else 0
        # sliding-window layers' span (0: none): a saved state keeps only their last cells
        self.swa_window = max(0, llama_cpp.llama_model_n_swa(self.model))
        # logit rows the engine ever asks for: one per running sequence, and the draft rows
        self.n_outputs_max = cfg.max_num_seqs + self.max_draft_rows
        self._load_template(self.model, cfg)
        declared = llama_cpp.llama_pooling_type(self.ctx)  # the GGUF's, NONE for a chat model
        max_embed = min(cfg.max_embed_tokens, self.n_ctx)
        self.embedder = EmbeddingContext(
            self.model, cfg, choose_pooling(cfg, declared), max_embed, self.n_vocab
        )
        self.is_embedding_only = cfg.kind == "embedding" or declared in POOLING_NAMES
        self.info = self._describe(name, cfg)
        self._eog_ids = np.array(
            [t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t)],
            dtype=np.int32,
        )
        self._eog_set = frozenset(self._eog_ids.tolist())
        # structured output: llguidance's tokenizer, built at the first constrained request
        self._grammar = GrammarEngine(self._grammar_tokenizer, self.n_vocab)
        self._pieces: dict[int, bytes] = {}
        # control tokens the model's call and reasoning formats are written with ([TOOL_CALLS],
        # <|python_tag|>, ...): their pieces are rendered, as llama-server's preserved tokens
        formats = model_formats(
            cfg.chat_format, self.template_source, cfg.tool_format, cfg.reasoning_format
        )
        self._preserved = self._token_ids(formats.preserved_tokens)
        self._positions = np.arange(self.n_ctx, dtype=np.int32)
        self._init_batch()
        self.timings = RunTimings()

    # --- set-up ----------------------------------------------------------------------------

    def _new_context(self, name: str, cfg: ModelConfig):
        n_threads, n_threads_batch = cfg.threads()
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = cfg.n_ctx
        p.n_batch = p.n_ubatch = cfg.max_num_batched_tokens
        # sequence ids for the running set and for cached prefixes; only running ones sample
        p.n_seq_max = cfg.max_num_seqs + cfg.max_cached_prefixes
        # the default reserves n_ubatch rows of logits (514 MiB with Gemma's vocabulary);
        # llama.cpp asserts at least n_seq_max rows, though only running sequences (and their
        # drafts) sample
        p.n_outputs_max = logit_rows(cfg)
        p.kv_unified = True
        p.swa_full = True  # keep whole histories in sliding-window layers
        p.n_threads, p.n_threads_batch = n_threads, n_threads_batch
        p.flash_attn_type = _FLASH_ATTN[cfg.flash_attn]
        p.type_k, p.type_v = _KV_TYPES[cfg.cache_type_k], _KV_TYPES[cfg.cache_type_v]
        p.offload_kqv = cfg.offload_kqv
        p.no_perf = True
        ctx = llama_cpp.llama_init_from_model(self.model, p)
        if not ctx:
            llama_cpp.llama_model_free(self.model)
            if cfg.cache_type_v != "f16":
                raise ValueError(
                    f"models.{name}.cache_type_v: a {cfg.cache_type_v} V cache needs flash "
                    "attention, which llama.cpp could not enable for this model on this device; "
                    'use cache_type_v = "f16"'
                )
            raise ValueError(f"models.{name}: llama.cpp could not create a context (n_ctx?)")
        return ctx

    def _grammar_tokenizer(self):
        """llguidance's view of the vocabulary; every end-of-generation token is its EOS, so
        a grammar allows the reply to end exactly where it accepts.

        As `llguidance.llamacpp.lltokenizer_from_vocab` builds it (control tokens, and
        user-defined ones that look like `<...>`, marked with a 0xff byte: special, matched
        only by name), but with llama.cpp's current attribute call: the deprecated one that
        helper uses warns once per token, 262,144 warnings that slow the build several-fold.
        """
        import llguidance

        special = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
        user = llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
        pieces = []
        for t in range(self.n_vocab):
            piece = self._raw_piece(t)
            attr = llama_cpp.llama_vocab_get_attr(self.vocab, t)
            if attr & special or (attr & user and piece[:1] == b"<" and piece[-1:] == b">"):
                piece = b"\xff" + piece
            pieces.append(piece)
        tokenize = ctypes.cast(llama_cpp.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
        return llguidance.LLTokenizer.from_llamacpp(
            tokens=pieces,
            vocab_ptr=self.vocab,
            tokenize_fptr=tokenize,
            eos_token=self._eog_ids.tolist(),
            slices=None,
        )

    def _raw_piece(self, token: int) -> bytes:
        """A token's bytes with special tokens rendered (their text, e.g. `<end_of_turn>`)."""
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 256, 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, True)
        return buf.raw[:n]

    def where(self) -> str:
        """The start-up block: backend and devices, layers, KV cache, flash attention."""
        i = self.info
        return describe(self.placement, i.backend, i.n_threads, i.n_layer, i.devices)

    def _describe(self, name: str, cfg: ModelConfig) -> ModelInfo:
        n_layer = llama_cpp.llama_model_n_layer(self.model)
        offload = rpc.has_local_gpu()  # not llama_supports_gpu_offload(): true for RPC builds
        system = llama_cpp.llama_print_system_info().decode(errors="replace")
        backend = ("CUDA" if "CUDA" in system else "GPU") if offload else "CPU"
        n_gpu = 0 if not offload else n_layer if cfg.n_gpu_layers < 0 else cfg.n_gpu_layers
        return ModelInfo(
            model=name,
            backend=backend,
            n_ctx=self.n_ctx,
            n_seq_max=self.n_seq_max,
            n_batch=self.n_batch,
            n_vocab=self.n_vocab,
            n_layer=n_layer,
            n_gpu_layers=min(n_gpu, n_layer),
            n_threads=cfg.threads()[0],
            chat_template=cfg.chat_template or describe_template(self),
            max_num_seqs=cfg.max_num_seqs,
            max_draft_rows=self.max_draft_rows,
            n_embd=self.embedder.n_embd,
            pooling=POOLING_NAMES[self.embedder.pooling],
            is_embedding_only=self.is_embedding_only,
            max_embed_tokens=self.embedder.max_tokens,
            max_embed_inputs=cfg.max_embed_inputs,
            max_embed_step_inputs=self.embedder.max_inputs,
            # empty unless the layers are split or off the CPU
            devices=split_devices(self.placement, {d.name: d.description for d in rpc.devices()}),
        )

    def _init_batch(self) -> None:
        self._b = LlamaBatch(self.n_batch)
        self._batch, self._tok, self._pos = self._b.batch, self._b.tok, self._b.pos
        self._logits, self._seq = self._b.logits, self._b.seq

    def piece(self, token: int) -> bytes:
        cached = self._pieces.get(token)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            special = token in self._preserved
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
            cached = self._pieces[token] = buf.raw[:n]
        return cached

    def _token_ids(self, texts: tuple[str, ...]) -> frozenset[int]:
        """The ids of those texts that are one token each in this vocabulary."""
        ids = (self.tokenize(text, add_special=False) for text in texts)
        return frozenset(t[0] for t in ids if len(t) == 1)

    def is_eog(self, token: int) -> bool:
        return token in self._eog_set

    # --- sampling --------------------------------------------------------------------------

    def new_sampler(self, params: SamplingParams) -> Sampler | _SamplerChain | Constrained:
        """numpy sampling on the logits; llama.cpp's chain only for penalties (repeat, frequency,
        presence), which need the token history; either under the request's grammar, if any."""
        inner = self._new_inner_sampler(params)
        if params.constraint is None:
            return inner
        return self._grammar.new_sampler(inner, params.constraint)

    def _new_inner_sampler(self, params: SamplingParams) -> Sampler | _SamplerChain:
        if not params.has_penalties:
            return Sampler(params, self._eog_ids)
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        add = llama_cpp.llama_sampler_chain_add
        if params.ignore_eos and len(self._eog_ids):
            biases = (llama_cpp.llama_logit_bias * len(self._eog_ids))()
            for i, t in enumerate(self._eog_ids.tolist()):
                biases[i].token, biases[i].bias = t, float("-inf")
            add(chain, llama_cpp.llama_sampler_init_logit_bias(self.n_vocab, len(biases), biases))
        penalties = llama_cpp.llama_sampler_init_penalties(
            self.n_vocab,
            params.repeat_last_n,
            params.repeat_penalty,
            params.frequency_penalty,
            params.presence_penalty,
        )
        add(chain, penalties)
        if params.temperature < MIN_TEMPERATURE:
            add(chain, llama_cpp.llama_sampler_init_greedy())
            return _SamplerChain(chain)
        add(chain, llama_cpp.llama_sampler_init_top_k(params.num_candidates))
        add(chain, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        add(chain, llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
        add(chain, llama_cpp.llama_sampler_init_temp(params.temperature))
        seed = llama_cpp.LLAMA_DEFAULT_SEED if params.seed is None else params.seed
        add(chain, llama_cpp.llama_sampler_init_dist(seed))
        return _SamplerChain(chain)

    def free_sampler(self, sampler) -> None:
        if isinstance(sampler, Constrained):
            sampler = sampler.inner
        if isinstance(sampler, _SamplerChain):
            llama_cpp.llama_sampler_free(sampler.ptr)

    def _row(self, row: int) -> np.ndarray:
        """A writable view of the logits of batch row `row` (the chain reads the same memory)."""
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, row)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def _draw(self, sampler, row: int) -> int:
        if isinstance(sampler, _SamplerChain):
            return llama_cpp.llama_sampler_sample(sampler.ptr, self.ctx, row)
        return sampler.sample(self._row(row))

    def _sample(self, row: int, seq) -> Sampled:
        """One sequence's token; a failure is returned for that sequence alone, never raised."""
        is_last = False
        try:
            sampler = seq.sampler
            if isinstance(sampler, Constrained):  # this row's logits only
                inner = sampler.inner
                token = sampler.sample(
                    self._row(row),
                    lambda: self._draw(inner, row),
                    may_redraw=not isinstance(inner, _SamplerChain),
                )
                if 0 <= token < self.n_vocab:
                    is_last = sampler.accept(token)
            else:
                token = self._draw(sampler, row)
        except Exception as e:  # numpy, ctypes or the grammar: this sequence's problem only
            why = str(e) if isinstance(e, SamplingError) else f"sampling failed: {e}"
            return Sampled(seq, error=why)
        if not 0 <= token < self.n_vocab:
            return Sampled(seq, error=f"sampling gave token {token}, outside the vocabulary")
        return Sampled(seq, token, self.piece(token), token in self._eog_set, is_last=is_last)

    # --- the step --------------------------------------------------------------------------

    def run(self, batch: Batch) -> list[Sampled]:
        """Apply the cell operations, fill the llama_batch, decode, sample the logit rows (a
        drafted row: its rows in order while they agree with the draft, `verify_draft`)."""
        self.timings = RunTimings()
        restore_s = apply_cell_ops(self, batch.cell_ops)
        self.timings = RunTimings(restore_s=restore_s)
        if not batch.items:
            return []
        start = time.perf_counter()
        rows = self._fill(batch)
        for _, seq, _ in rows:  # constrained rows: their masks are computed during the decode
            if isinstance(seq.sampler, Constrained):
                seq.sampler.prepare()
        filled = time.perf_counter()
        rc = llama_cpp.llama_decode(self.ctx, self._batch)  # releases the GIL
        decoded = time.perf_counter()
        if rc == 1:
            raise KVCacheFull("llama_decode: no free KV cells for this batch")
        if rc != 0:
            raise DecodeError(f"llama_decode returned {rc}")
        sampled = []
        for row, seq, draft in rows:
            if draft:
                sampled += verify_draft(draft, lambda j, r=row, q=seq: self._sample(r + j, q))
            else:
                sampled.append(self._sample(row, seq))
        self.timings = RunTimings(
            filled - start, decoded - filled, time.perf_counter() - decoded, restore_s=restore_s
        )
        return sampled

    def _fill(self, batch: Batch) -> list[tuple[int, object, tuple[int, ...]]]:
        """The llama_batch; returns (first logit row, sequence, draft) per item that samples."""
        if batch.num_tokens > self.n_batch:  # llama.cpp would abort the process
            raise ValueError(f"batch of {batch.num_tokens} tokens exceeds n_batch {self.n_batch}")
        if batch.num_logit_rows > self.n_outputs_max:  # the other abort
            raise ValueError(
                f"{batch.num_logit_rows} logit rows exceed n_outputs_max {self.n_outputs_max}"
            )
        n = 0
        rows = []
        for seq, start, k, wants_logits, draft in batch.items:
            if draft:  # its last token, then the draft: every row samples
                self._tok[n] = seq.tokens[start]
                self._tok[n + 1 : n + k] = draft
                self._logits[n : n + k] = 1
                rows.append((n, seq, draft))
            else:
                self._tok[n : n + k] = seq.tokens[start : start + k]
                self._logits[n : n + k] = 0
                if wants_logits:
                    self._logits[n + k - 1] = 1
                    rows.append((n + k - 1, seq, ()))
            self._pos[n : n + k] = self._positions[start : start + k]
            self._seq[n : n + k] = seq.seq_id
            n += k
        self._batch.n_tokens = n
        return rows

    def embed(self, inputs: list[list[int]]) -> np.ndarray:
        """One pooled, L2-normalised vector per input, on the embedding context."""
        start = time.perf_counter()
        try:
            return self.embedder.embed(inputs)
        finally:
            self.timings = self.timings._replace(embed_s=time.perf_counter() - start)

    # --- memory ----------------------------------------------------------------------------

    def free_seq(self, seq_id: int) -> None:
        llama_cpp.llama_memory_seq_rm(self.mem, seq_id, -1, -1)

    def trim_seq(self, seq_id: int, num_tokens: int) -> bool:
        """Keep positions [0, num_tokens) of a sequence; False if the memory cannot."""
        return llama_cpp.llama_memory_seq_rm(self.mem, seq_id, num_tokens, -1)

    def copy_seq(self, src: int, dst: int, num_tokens: int) -> None:
        """Share positions [0, num_tokens) of `src` with `dst` (the cells gain an id)."""
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, 0, num_tokens)

    def seq_num_cells(self, seq_id: int) -> int:
        """Positions [0, pos_max] (every sequence starts at 0). A sliding-window layer may hold
        fewer: a restored state brings only the window's last cells for those (the pool's
        `exact_from` knows)."""
        return llama_cpp.llama_memory_seq_pos_max(self.mem, seq_id) + 1

    def save_seq(self, seq_id: int) -> bytearray:
        """The sequence's KV state (llama_state_seq_get_data): its cells' positions and data,
        written by llama.cpp straight into the bytes kept (no copy of megabytes on the step)."""
        size = llama_cpp.llama_state_seq_get_size(self.ctx, seq_id)
        if size <= 0:
            return bytearray()
        data = bytearray(size)
        n = llama_cpp.llama_state_seq_get_data(
            self.ctx, (ctypes.c_uint8 * size).from_buffer(data), size, seq_id
        )
        if n < size:  # (the view above is gone: the bytes may be cut)
            del data[max(n, 0) :]
        return data

    def restore_seq(self, seq_id: int, data: bytes | bytearray) -> bool:
        """llama_state_seq_set_data into `seq_id` (llama.cpp empties it first and checks the
        state's layers, cell types and sizes against this context: 0 when they differ or no
        cells are free, the sequence left empty). A saved bytearray is read in place."""
        size = len(data)
        array = ctypes.c_uint8 * size
        buf = (
            array.from_buffer(data) if isinstance(data, bytearray) else array.from_buffer_copy(data)
        )
        return llama_cpp.llama_state_seq_set_data(self.ctx, buf, size, seq_id) == size

    def close(self) -> None:
        if self.ctx is None:
            return
        self._grammar.close()
        self.embedder.close()
        self._b.free()
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)
        self.ctx = None
