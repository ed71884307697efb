"""Constrained sampling with llguidance: one matcher per constrained request, its own row only.

Chosen by measurement (benchmarks/grammar_engine_choice.py, docs/benchmarks.md "Structured
output"): on Gemma's 262,144 tokens llguidance computes a token mask in ~0.06 ms (p99 ~0.4 ms)
and compiles a realistic schema in ~2 ms, where llama.cpp's GBNF sampler spends milliseconds per
token over the whole vocabulary and aborts the process (an uncaught C++ exception) when it is
made to accept a token its grammar forbids.

`GrammarEngine` holds the llguidance tokenizer built once from the runner's vocabulary, at the
first constrained request, on a worker thread (about 2.5 s on a quiet machine: a Python loop over
262,144 pieces, so the other streams run slower while it holds the GIL; once per engine). That
request's first draw waits for it; later ones find it built. `Constrained` wraps a request's
sampler: each draw comes from that request's logit row (nobody else's) with every token the
grammar forbids at -inf (`Constrained.sample`), and the matcher advances by the accepted token.
Only sampled tokens reach the matcher: the prompt's prefill never does, and a sequence
recomputed after preemption keeps its sampler, so its matcher is never fed the same token twice.
The next token's mask depends only on tokens already accepted, so it is computed on a mask
thread while llama_decode runs (both release the GIL); the engine thread then waits only for
what the decode did not hide.

A constrained reply drafts too (speculative decoding): the scheduler cuts a draft where the
grammar would refuse it (`allowed_prefix`, llguidance's `validate_tokens`), and the runner draws
each draft row under the mask of the tokens kept before it, the matcher advancing only by the
tokens drawn, so a draft the grammar forbids is never kept and nothing has to be rolled back.

End of generation is allowed exactly where the grammar accepts (the tokenizer's EOS set is the
model's end-of-generation tokens); a grammar that can take nothing more ends the reply after
the token that completed it (`is_last`). A matcher error fails that one sequence.

Tested in tests/unit/runners/test_grammar.py.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import numpy as np

from localserve.chat.constraints import parser_limits  # the limits the server checked with
from localserve.engine.sampling_params import Constraint
from localserve.runners.sampling import SamplingError


class GrammarEngine:
    """The llguidance tokenizer of one vocabulary and the requests' matchers, built off the
    engine thread (one worker thread), the compiled ones kept by grammar text (LRU)."""

    def __init__(self, build_tokenizer, n_vocab: int, cache_size: int = 64) -> None:
        self.n_vocab = n_vocab
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="grammar")
        self._build_tokenizer = build_tokenizer
        self._tokenizer: Future | None = None  # built at the first constrained request
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        # the masks of a step, computed while llama_decode runs (both release the GIL)
        self._masker = ThreadPoolExecutor(2, thread_name_prefix="grammar-mask")

    def new_sampler(self, inner, constraint: Constraint) -> Constrained:
        """`inner` under `constraint`; its matcher is compiled meanwhile on the worker."""
        if self._tokenizer is None:
            self._tokenizer = self._worker.submit(self._build_tokenizer)
        matcher = self._worker.submit(self._matcher, constraint)
        return Constrained(inner, matcher, self.n_vocab, self._masker)

    def _matcher(self, constraint: Constraint) -> llguidance.LLMatcher:
        with self._lock:
            cached = self._compiled.get(constraint.grammar)
            if cached is not None:
                self._compiled.move_to_end(constraint.grammar)
                return cached.deep_copy()
        m = llguidance.LLMatcher(
            self._tokenizer.result(), constraint.grammar, log_level=0, limits=parser_limits()
        )
        if m.is_error():
            raise SamplingError(f"response_format: the grammar was refused: {m.get_error()}")
        with self._lock:
            self._compiled[constraint.grammar] = m.deep_copy()
            while len(self._compiled) > self._cache_size:
                self._compiled.popitem(last=False)
        return m

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
        self._masker.shutdown(wait=False, cancel_futures=True)


class Constrained:
    """A request's sampler under a grammar: mask its row, draw with `inner`, advance.

    The next token's mask depends only on the tokens accepted so far, so the runner asks for it
    (`prepare`) before the forward pass and it is computed on a mask thread meanwhile; `mask`
    then only waits for it (or computes it, when it was not prepared) and applies it.
    """

    def __init__(self, inner, matcher: Future, n_vocab: int, masker=None) -> None:
        self.inner = inner  # the unconstrained sampler (numpy Sampler or a llama.cpp chain)
        self._future = matcher  # compiling on the grammar worker; awaited at the first draw
        self.matcher: llguidance.LLMatcher | None = None
        self.n_vocab = n_vocab
        self._bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
        self._masker = masker
        self._pending: Future | None = None  # the next mask, being computed
        self.num_masks = 0
        self.compute_s = 0.0  # computing masks, wherever it ran
        self.wait_s = 0.0  # the engine thread's time in `mask` (what it costs everyone)

    def prepare(self) -> None:
        """Start computing the next mask on the mask thread (once the grammar is compiled)."""
        if self._pending is None and self._masker is not None and self._future.done():
            try:
                self._pending = self._masker.submit(self._compute, self._ready())
            except (RuntimeError, SamplingError):  # shut down, or refused: `mask` will say
                self._pending = None

    def _compute(self, m: llguidance.LLMatcher) -> None:
        start = time.perf_counter()
        m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        self.compute_s += time.perf_counter() - start

    def _ready(self) -> llguidance.LLMatcher:
        if self.matcher is None:
            try:
                self.matcher = self._future.result()  # at once unless it is still compiling
            except SamplingError:
                raise
            except Exception as e:  # the tokenizer could not be built, or llguidance raised
                raise SamplingError(f"response_format: the grammar failed to compile: {e}") from e
        return self.matcher

    def sample(self, logits: np.ndarray, draw, may_redraw: bool) -> int:
        """A token the grammar allows, drawn by `draw()` from `logits` (this row only).

        With `may_redraw` (a draw that keeps no history: the numpy sampler, the fake's argmax)
        the unmasked draw is tried first and kept when the grammar allows it, which is most
        tokens of a JSON reply; otherwise the forbidden tokens are set to -inf and it draws
        again. Either way the token comes from the masked distribution (rejection sampling:
        p(t) + (1 - Z) p(t) / Z = p(t) / Z). llama.cpp's chain records what it draws for its
        penalties, so it draws once, from the masked row.
        """
        start = time.perf_counter()
        self._wait_for_mask()
        token = draw() if may_redraw else -1
        if not self.allows(token):
            self._apply(logits)
            token = draw()
        self.num_masks += 1
        self.wait_s += time.perf_counter() - start
        return token

    def _wait_for_mask(self) -> None:
        m = self._ready()
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()
        else:
            self._compute(m)
        if m.is_error():
            raise SamplingError(f"response_format: {m.get_error()}")

    def allows(self, token: int) -> bool:
        """Does the mask just computed allow `token`?"""
        if not 0 <= token < self.n_vocab:
            return False
        return bool((int(self._bits[token >> 5]) >> (token & 31)) & 1)

    def _apply(self, logits: np.ndarray) -> None:
        """Set every token the grammar forbids now to -inf, in place."""
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: len(logits)]
        if not allowed.any():
            raise SamplingError("response_format: the grammar allows no token here")
        np.copyto(logits, -np.inf, where=~allowed.view(np.bool_))

    def allowed_prefix(self, draft: list[int]) -> int:
        """How many of a draft's tokens the grammar would take from here, in order (the
        scheduler cuts the draft there: a row the mask is sure to refuse is not spent). Only
        a cut: every kept token is still drawn under its own mask (`sample`), and the matcher
        advances only by what was drawn, so nothing is ever rolled back. 0 while the grammar
        is still compiling (never waited for here)."""
        if self.matcher is None and not self._future.done():
            return 0
        try:
            m = self._ready()
        except SamplingError:
            return 0  # the first draw will say why
        pending = self._pending
        if pending is not None:  # the next mask, being computed on this matcher: let it finish
            pending.result()
        if m.is_error():
            return 0
        return m.validate_tokens(list(draft))

    def accept(self, token: int) -> bool:
        """Advance by the sampled token; True when the grammar can take nothing more."""
        m = self._ready()
        if not m.consume_token(token) or m.is_error():
            raise SamplingError(f"response_format: token {token} refused: {m.get_error()}")
        return m.is_stopped()


def sample_constrained(sampler: Constrained, logits: np.ndarray) -> tuple[int, bool]:
    """The argmax of `logits` under the grammar, accepted: (token, is_last). The fake's draw."""
    token = sampler.sample(logits, lambda: int(logits.argmax()), may_redraw=True)
    return token, sampler.accept(token)
