"""The scheduler's output: one step's batch (what the runner computes) and what it sampled.

Tested in tests/unit/engine/test_scheduler.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from localserve.engine.prefix_tiers import SavedPrefix
from localserve.engine.sequence import Sequence


class CellOp(NamedTuple):
    """A cell operation for llama.cpp: free a sequence, keep its first n positions, copy them,
    save its state into a host-tier entry or restore an entry's state into it."""

    kind: str  # "free" | "trim" | "copy" | "save" | "restore"
    seq_id: int
    n: int = 0  # trim: positions to keep; copy: positions [0, n) to copy
    dst: int = -1  # copy: the sequence that receives them
    saved: SavedPrefix | None = None  # save: the entry to fill; restore: the entry to read


class BatchItem(NamedTuple):
    seq: Sequence
    start: int  # position of the chunk's first token (== seq.num_computed)
    num_tokens: int
    wants_logits: bool  # the chunk ends at the sequence's last token: sample after it
    # a decode row's draft (localserve.engine.speculative): these tokens follow its last one in
    # the batch, every row with logits; num_tokens counts them
    draft: tuple[int, ...] = ()


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
    num_draft_tokens: int = 0  # drafted tokens riding on decode rows (also rows with logits)
    admitted: list[Sequence] = field(default_factory=list)
    first_admitted: list[Sequence] = field(default_factory=list)  # of those, never preempted
    preempted: list[Sequence] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)  # cancelled, refused or failed
    cell_ops: list[CellOp] = field(default_factory=list)  # for the runner, before it decodes
    # its prompt tokens go past what the ITL target allows beside its decodes: the TTFT target
    # stretched the step (first tokens due, scheduler.py's `_deadline_rate`)
    is_stretched: bool = False
    # what the step gave (the scheduler's postprocess): tokens kept, drafted rows verified,
    # draft tokens accepted, and accepted by position in their draft
    kept: list[tuple[Sequence, int]] = field(default_factory=list)  # per sequence that drew
    num_generated: int = 0
    num_drafts: int = 0
    num_accepted_tokens: int = 0
    accepted_by_position: list[int] = field(default_factory=list)
    # embedding inputs (localserve.engine.embedding.EmbedItem), decoded after the items on the
    # runner's embedding context; their tokens are not in `num_tokens` (another decode)
    embeds: list = field(default_factory=list)
    num_embed_tokens: int = 0
    embed_s: float = 0.0  # what the runner's embedding decode took (set after the step)
    restore_s: float = 0.0  # what saving and restoring prefixes took (set after the step)
    restored: list = field(default_factory=list)  # sequences admitted with a restored prefix
    embeds_finished: list = field(default_factory=list)  # embedding requests ended this step

    @property
    def num_tokens(self) -> int:
        return self.num_decode_tokens + self.num_prefill_tokens + self.num_draft_tokens

    @property
    def num_logit_rows(self) -> int:
        return sum(item.wants_logits for item in self.items) + self.num_draft_tokens


def by_sequence(sampled: list[Sampled]) -> list[tuple[Sequence, list[Sampled]]]:
    """The runner's draws grouped by sequence, in order (a drafted row gives several)."""
    groups: list[tuple[Sequence, list[Sampled]]] = []
    for s in sampled:
        if groups and groups[-1][0] is s.seq:
            groups[-1][1].append(s)
        else:
            groups.append((s.seq, [s]))
    return groups
