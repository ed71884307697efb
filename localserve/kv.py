"""KV-cache accounting: the unified pool of cells as a capacity pool, and the sequence ids.

Token-level, like llama.cpp's unified cache: one cell per token per sequence. Three numbers:
- used: cells that hold computed tokens (what llama.cpp reports through seq_pos_*);
- committed: used plus cells promised to admitted prompts not yet prefilled;
- total: the context size.
A prompt is admitted only if it fits in uncommitted cells above the watermark, so a running
prefill never runs out; decode growth takes free cells one at a time and may trigger preemption.
"""

from __future__ import annotations

from localserve.sequence import Sequence


class KVPool:
    """Cell and sequence-id accounting; pure Python, the runner does the real freeing."""

    def __init__(self, num_cells: int, num_seq_ids: int, watermark: float = 0.0) -> None:
        if num_cells < 1 or num_seq_ids < 1:
            raise ValueError("KVPool needs at least one cell and one sequence id")
        self.num_cells = num_cells
        self.num_watermark_cells = int(num_cells * watermark)
        self.num_used = 0
        self.num_committed = 0
        self._free_ids = list(range(num_seq_ids - 1, -1, -1))  # pop() hands out 0 first
        self._to_clear: list[int] = []  # seq ids whose cells the runner must drop

    @property
    def num_free(self) -> int:
        return self.num_cells - self.num_committed

    @property
    def num_free_seq_ids(self) -> int:
        return len(self._free_ids)

    def can_admit(self, seq: Sequence) -> bool:
        """Does the sequence's whole prompt fit, keeping the watermark free?"""
        need = len(seq.tokens) + self.num_watermark_cells
        return bool(self._free_ids) and need <= self.num_free

    def admit(self, seq: Sequence) -> None:
        """Give the sequence an id and commit cells for every token it has."""
        seq.seq_id = self._free_ids.pop()
        seq.num_cells = len(seq.tokens)
        self.num_committed += seq.num_cells

    def ensure(self, seq: Sequence, num_tokens: int) -> bool:
        """Commit cells so the sequence can hold `num_tokens`; False if the pool is out."""
        extra = num_tokens - seq.num_cells
        if extra <= 0:
            return True
        if extra > self.num_free:
            return False
        seq.num_cells += extra
        self.num_committed += extra
        return True

    def computed(self, seq: Sequence, num_tokens: int) -> None:
        """Record that `num_tokens` more of the sequence's tokens are now in the cache."""
        seq.num_computed += num_tokens
        self.num_used += num_tokens

    def release(self, seq: Sequence) -> None:
        """Free everything the sequence holds; its id is cleared in the runner before reuse."""
        if seq.seq_id is None:
            return
        self.num_used -= seq.num_computed
        self.num_committed -= seq.num_cells
        seq.num_cells = 0
        self._to_clear.append(seq.seq_id)
        self._free_ids.append(seq.seq_id)
        seq.seq_id = None

    def shrink(self, num_cells: int) -> None:
        """Lower the capacity (llama.cpp found fewer cells than we counted)."""
        self.num_cells = max(1, min(self.num_cells, num_cells))

    def take_cleared(self) -> list[int]:
        """Seq ids released since the last call; the engine frees their cells in llama.cpp."""
        ids, self._to_clear = self._to_clear, []
        return ids
