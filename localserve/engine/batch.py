"""The scheduler's output: one step's batch (what the runner computes) and what it sampled.

Tested in tests/unit/engine/test_scheduler.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from localserve.engine.kv import CellOp
from localserve.engine.sequence import Sequence


class BatchItem(NamedTuple):
    seq: Sequence
    start: int  # position of the chunk's first token (== seq.num_computed)
    num_tokens: int
    wants_logits: bool  # the chunk ends at the sequence's last token: sample after it


class Sampled(NamedTuple):
    """A sequence's next token, or why none could be drawn (that sequence alone fails)."""

    seq: Sequence
    token: int = -1
    piece: bytes = b""  # the token's bytes (may be part of a character)
    is_eog: bool = False
    error: str = ""
    is_last: bool = False  # the request's grammar is complete: the reply ends after this token


@dataclass
class Batch:
    items: list[BatchItem] = field(default_factory=list)
    num_decode_tokens: int = 0
    num_prefill_tokens: int = 0
    admitted: list[Sequence] = field(default_factory=list)
    first_admitted: list[Sequence] = field(default_factory=list)  # of those, never preempted
    preempted: list[Sequence] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)  # cancelled, refused or failed
    cell_ops: list[CellOp] = field(default_factory=list)  # for the runner, before it decodes

    @property
    def num_tokens(self) -> int:
        return self.num_decode_tokens + self.num_prefill_tokens
