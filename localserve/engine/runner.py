"""The one seam to the hardware: what the engine needs from a model runner.

`localserve.runners.llama.LlamaRunner` implements it over llama.cpp; `localserve.runners.fake`
has a deterministic fake for logic tests. Every llama_cpp call lives behind this protocol.

A step is one call: `run(batch)` applies the KV cell operations the pool decided (free, trim,
copy, in order), decodes the batch and returns one `Sampled` per sequence that wanted logits,
with the token's text piece and whether it ends generation. A step with embedding inputs then
calls `embed(inputs)`: one more decode, on the runner's embedding context (its own cells, never
the chat cache), giving one pooled, L2-normalised vector per input; the engine times both calls
as the step.

Tested in tests/unit/engine/test_engine.py and tests/e2e/test_llama_runner.py.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple, Protocol

from localserve.engine.batch import Batch, CellOp, Sampled
from localserve.engine.sampling_params import SamplingParams
from localserve.protocol.snapshot import ModelInfo


class KVCacheFull(Exception):
    """llama_decode returned 1: no free KV slot for the batch; nothing was computed."""


class RestoreFailed(Exception):
    """A saved prefix could not be copied back into the cells (llama.cpp refused its state):
    nothing of the batch was computed; those sequences are prefilled instead."""

    def __init__(self, seq_ids: list[int]) -> None:
        super().__init__(f"could not restore saved prefixes into sequences {seq_ids}")
        self.seq_ids = seq_ids


class DecodeError(Exception):
    """llama_decode failed (aborted, invalid batch or a fatal error); the batch is lost."""


class RunTimings(NamedTuple):
    """Where the last `run` spent its time, in seconds (a public hook for benchmarks)."""

    fill_s: float = 0.0  # copying the batch into llama.cpp's buffers
    decode_s: float = 0.0  # inside llama_decode
    sample_s: float = 0.0  # drawing the tokens
    embed_s: float = 0.0  # the embedding decode of the step (0: none), pooling included
    restore_s: float = 0.0  # copying saved prefixes out of and into the cells (save, restore)


class Runner(Protocol):
    info: ModelInfo
    timings: RunTimings  # of the last run()
    supports_prefix_reuse: bool  # can a sequence be cut back to a prefix (trim_seq)?
    template_source: str | None  # its chat template's text or built-in name (formats are read)

    def tokenize(self, text: str, add_special: bool = True) -> list[int]: ...

    def apply_chat_template(
        self, messages: list[dict], tools: list[dict] | None = None, **template_kwargs: Any
    ) -> str:
        """A chat's prompt text; `tools` and `template_kwargs` (enable_thinking, ...) reach a
        Jinja template. Raises ValueError when the template cannot render the chat."""

    def piece(self, token: int) -> bytes: ...

    def new_sampler(self, params: SamplingParams) -> Any: ...

    def free_sampler(self, sampler: Any) -> None: ...

    def run(self, batch: Batch) -> list[Sampled]:
        """Apply `batch.cell_ops` (first, whatever happens next: the pool already counts them
        done), decode the batch, sample each item that wants logits.

        Raises KVCacheFull (nothing computed; the cell operations stay applied), DecodeError or
        ValueError (the batch is lost) and RuntimeError (a cell operation was refused).
        """
        ...

    def embed(self, inputs: list[list[int]]) -> Any:
        """One vector per input (token ids; at most ModelInfo.max_embed_tokens tokens and
        max_embed_step_inputs inputs together), pooled and L2-normalised: a float32 array of
        shape (len(inputs), n_embd). Each input's cells are gone again when it returns; sets
        `timings.embed_s`. Raises DecodeError or ValueError (those inputs are lost, nothing
        else)."""
        ...

    def free_seq(self, seq_id: int) -> None: ...

    def trim_seq(self, seq_id: int, num_tokens: int) -> bool:
        """Keep a sequence's positions [0, num_tokens); False if the memory cannot."""
        ...

    def copy_seq(self, src: int, dst: int, num_tokens: int) -> None:
        """Share positions [0, num_tokens) of `src` with `dst` (free in a unified cache)."""
        ...

    def seq_num_cells(self, seq_id: int) -> int:
        """Cells the cache holds for a sequence (from its position range)."""
        ...

    def save_seq(self, seq_id: int) -> bytes | bytearray:
        """A sequence's KV state as bytes (b"" when it cannot be saved)."""
        ...

    def restore_seq(self, seq_id: int, data: bytes) -> bool:
        """Put a saved state into a sequence (emptied first); False if llama.cpp refuses it
        (no room, another model's or build's state), the sequence then empty."""
        ...

    def close(self) -> None: ...


def apply_cell_ops(runner: Runner, ops: list[CellOp]) -> float:
    """Apply the pool's cell operations in the order they were decided; returns the seconds
    spent saving and restoring prefixes.

    All of them, even after a refusal (sequence ids get reused); then a refused trim (a memory
    without partial removal) raises RuntimeError: the pool and the cache no longer agree; a
    refused restore raises RestoreFailed (the scheduler prefills those sequences instead). A
    failed save only leaves its entry empty (the host tier drops it).
    """
    refused, unrestored, copy_s = [], [], 0.0
    for op in ops:
        if op.kind == "free":
            runner.free_seq(op.seq_id)
        elif op.kind == "copy":
            runner.copy_seq(op.seq_id, op.dst, op.n)
        elif op.kind in ("save", "restore"):
            start = time.perf_counter()
            if op.kind == "save":
                op.saved.data = _saved(runner, op)
            elif not (op.saved.data and _restored(runner, op)):
                runner.free_seq(op.seq_id)  # whatever a refused state left there
                unrestored.append(op.seq_id)
            copy_s += time.perf_counter() - start
        elif op.seq_id in unrestored:
            continue  # its cut is moot: it is prefilled from the start
        elif not runner.trim_seq(op.seq_id, op.n):
            refused.append(op)
    if refused:
        raise RuntimeError(f"llama.cpp could not trim sequences to a prefix: {refused}")
    if unrestored:
        raise RestoreFailed(unrestored)
    return copy_s


def _saved(runner: Runner, op: CellOp) -> bytes:
    """The state of the op's sequence, or b"" when it does not hold exactly the op's positions
    (a copy of other cells would restore the wrong tokens)."""
    try:
        if runner.seq_num_cells(op.seq_id) != op.n:
            return b""
        return runner.save_seq(op.seq_id)
    except Exception:  # this entry is lost, nothing else
        return b""


def _restored(runner: Runner, op: CellOp) -> bool:
    try:
        return runner.restore_seq(op.seq_id, op.saved.data) and (
            runner.seq_num_cells(op.seq_id) == op.n
        )
    except Exception:
        return False
