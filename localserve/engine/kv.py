"""KV-cache accounting: the unified pool of cells as a capacity pool, sequence ids, cached prefixes.

Token-level, like llama.cpp's unified cache: one cell per token position, and a cell may belong to
several sequences at once (`llama_memory_seq_cp` only adds a sequence id to it). Three numbers:
- used: cells that hold computed tokens, each counted once however many sequences share it;
- committed: used plus cells promised to admitted prompts not yet prefilled;
- total: the context size.
A prompt is admitted only if it fits in uncommitted cells above the watermark, so a running
prefill never runs out; decode growth takes free cells one at a time and may trigger preemption.

Prefix caching: a finished sequence's cells stay in the cache as a `CachedPrefix` owned by its
user, under its sequence id. A new request whose tokens start the same way takes the prefix over
(its id, cells trimmed to the common part) and prefills only the rest. A system prompt shared by
many requests is cached as a *system prompt* entry: prefilled once, kept under an id of its own
and copied into each request that starts with it, so its cells are shared. Cached prefixes are
evicted whenever admission or decode growth needs cells or ids, before any live sequence is
preempted, in the tiers' order (localserve.engine.prefix_tiers.victim_order: a person's older
prefixes before anyone's latest, what a lower tier holds a copy of before what would be
prefilled again, then the least recently used). A system prompt entry is evicted only when no
sequence and no cached prefix shares its cells.

Below the cells (localserve.engine.prefix_tiers): a finished turn's or a preempted sequence's
state is copied once into the host tier (a "save"); a request whose longest prefix is only there
is admitted as without reuse, its first tokens copied back (a "restore", then a trim). While
sequences run, a cached prefix the host holds leaves the cells (`shed_saved`): kept, it slows
every step. The pool only counts; the cell operations it decides are queued, and the next batch
carries them to the runner, which applies them in llama.cpp, in order, before it decodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from localserve.engine.batch import CellOp
from localserve.engine.prefix_tiers import (
    CHEAP_TOKENS,
    MIN_RESTORE_GAIN,
    HostTier,
    SavedPrefix,
    common_prefix,
    covers,
    usable,
    victim_order,
)
from localserve.engine.sequence import Sequence

MIN_REUSE_TOKENS = 16  # shorter common prefixes are not worth a sequence id or a lookup


@dataclass(eq=False)
class CachedPrefix:
    """Cells of tokens[0:len] kept under `seq_id`: a finished sequence's, or a system prompt's."""

    seq_id: int
    tokens: list[int]
    owner: str | None  # the user whose requests may reuse it; None = every user
    is_system: bool = False  # shared by copying (a system prompt), never taken over
    system: CachedPrefix | None = None  # the system prompt its first `num_system` positions share
    num_system: int = 0
    refs: int = 0  # system prompts: sequences and cached prefixes sharing its cells
    last_used: int = 0
    saved: SavedPrefix | None = None  # its copy in the host tier, if any
    exact_from: int = 0  # restored: it may be cut back no shorter (Sequence.exact_from)
    unsaved: bool = False  # a finished turn whose copy to the host tier waits (emit_saves)
    num_prompt: int = 0  # ... and its prompt's length (the checkpoint of a windowed model)

    @property
    def is_cheap(self) -> bool:
        """Getting it back costs little: a copy below (a restore), or a short prefill."""
        return self.num_own < CHEAP_TOKENS or (self.saved is not None and self.saved.is_usable)

    @property
    def num_own(self) -> int:
        """Cells that go when it is evicted (shared ones stay with the system prompt)."""
        return len(self.tokens) - self.num_system


class Match(NamedTuple):
    prefix: CachedPrefix | None  # None: a restore of `saved`
    num_tokens: int  # positions [0, num_tokens) are reused
    saved: SavedPrefix | None = None  # a prefix restored from the host tier


class KVPool:
    """Cell, sequence-id and cached-prefix accounting; pure Python, the runner moves the cells."""

    def __init__(
        self,
        num_cells: int,
        num_seq_ids: int,
        watermark: float = 0.0,
        prefix_caching: bool = False,
        share_prefixes: str = "user",
        host: HostTier | None = None,
        swa_window: int = 0,
        shed_saved: bool = False,
    ) -> None:
        """`host`: the host tier below the cells; `swa_window`: the model's sliding window
        (0: none), which limits where a restored state may be cut (prefix_tiers.usable);
        `shed_saved`: while anything runs, what the host holds leaves the cells (`_shed`)."""
        if num_cells < 1 or num_seq_ids < 1:
            raise ValueError("KVPool needs at least one cell and one sequence id")
        self.num_cells = num_cells
        self.num_watermark_cells = int(num_cells * watermark)
        self.num_used = 0
        self.num_committed = 0
        self.prefix_caching = prefix_caching
        self.share_all, self.shed_saved = share_prefixes == "all", shed_saved
        self.prefixes: list[CachedPrefix] = []
        # the host tier below the cells (disabled without prefix caching)
        self.host = host if host is not None and prefix_caching else HostTier(0)
        self.swa_window = self.host.window = swa_window
        self.num_evictions = 0
        self._tick = 0  # LRU clock
        self._free_ids = list(range(num_seq_ids - 1, -1, -1))  # pop() hands out 0 first
        self._ops: list[CellOp] = []
        self.op_bytes = 0  # what the saves and restores among them will copy (estimates)
        self._unsaved: list[CachedPrefix] = []  # finished turns whose save waits for room

    @property
    def num_free(self) -> int:
        return self.num_cells - self.num_committed

    @property
    def num_free_seq_ids(self) -> int:
        return len(self._free_ids)

    @property
    def num_cached(self) -> int:
        """Cells that only cached prefixes hold: evicting every one of them would free these."""
        return self._evictable(keep=None)[0]

    # --- admission -------------------------------------------------------------------------

    def match(self, seq: Sequence) -> Match | None:
        """The cached prefix this sequence would reuse most of, among those it may see."""
        if not self.prefix_caching:
            return None
        best: Match | None = None
        limit = len(seq.tokens) - 1  # the last prompt token is computed again, for its logits
        for prefix in self.prefixes:
            if not (self.share_all or prefix.owner is None or prefix.owner == seq.user):
                continue
            n = min(common_prefix(prefix.tokens, seq.tokens), limit)
            if n < prefix.exact_from:
                continue  # restored: its sliding-window cells do not reach back that far
            # longest wins; on a tie copy the system prompt: taking over the user's cached
            # conversation would cut it back to the system prompt, and it may go on later
            if n >= MIN_REUSE_TOKENS and (
                best is None or (n, prefix.is_system) > (best.num_tokens, best.prefix.is_system)
            ):
                best = Match(prefix, n)
        return self._match_host(seq, best, limit)

    def _match_host(self, seq: Sequence, best: Match | None, limit: int) -> Match | None:
        """The host tier's match instead of the cells', when it reuses clearly more."""
        if not self.host.entries:
            return best
        found = self.host.match(seq.tokens, seq.user, self.share_all, limit)
        if found is None:
            return best
        saved, n = found
        if n - (best.num_tokens if best else 0) >= MIN_RESTORE_GAIN:
            return Match(None, n, saved)
        return best

    def try_admit(self, seq: Sequence, match: Match | None, watermark: bool = True) -> bool:
        """Admit if the prompt fits, evicting cached prefixes as needed; False if it cannot.

        A match keeps its prefix (and system prompt) from eviction, cells the request does not share
        included; if that is what stops it, the request is admitted without reuse instead.
        """
        if not self._try_admit(seq, match, watermark):
            if match is None or not self._try_admit(seq, None, watermark):
                return False
            match = None
        self._admit(seq, match)
        return True

    def _try_admit(self, seq: Sequence, match: Match | None, watermark: bool) -> bool:
        if match is not None and match.saved is not None:
            # a restore copies the whole entry back before it is trimmed to the common part
            need_cells = max(len(seq.tokens), len(match.saved.tokens))
            match = None
        else:
            need_cells = len(seq.tokens) - (match.num_tokens if match else 0)
        need_cells += self.num_watermark_cells if watermark else 0
        freed = self._freed_by_takeover(match)
        need_id = match is None or match.prefix.is_system
        keep = match.prefix if match else None
        cells, ids = self._evictable(keep)
        if need_cells > self.num_free + freed + cells or need_id > len(self._free_ids) + ids:
            return False
        self._evict_until(need_cells - freed, int(need_id), keep)
        return True

    def admit(self, seq: Sequence) -> None:
        """Give the sequence an id and commit cells for every token it has (no reuse)."""
        self._admit(seq, None)

    def _admit(self, seq: Sequence, match: Match | None) -> None:
        seq.num_cells = len(seq.tokens)
        seq.restored_from, seq.exact_from = None, 0
        if match is None or match.saved is not None:
            seq.seq_id = self._free_ids.pop()
            seq.num_computed = seq.num_system = 0
            seq.system = None
            self.num_committed += seq.num_cells
            if match is not None:
                self._restore(seq, match.saved, match.num_tokens)
            return
        prefix, n, _ = match
        self._tick += 1
        if prefix.is_system:  # share its cells: they gain this sequence's id
            prefix.last_used = self._tick
            prefix.refs += 1
            seq.seq_id = self._free_ids.pop()
            seq.system, seq.num_system = prefix, n
            self._ops.append(CellOp("copy", prefix.seq_id, n, seq.seq_id))
        else:  # take it over: its id, its cells up to the common part
            self.prefixes.remove(prefix)
            self._save_prefix(prefix, save=False)  # the turn taking it over is saved instead
            self._drop(self._freed_by_takeover(match))
            seq.seq_id = prefix.seq_id
            seq.exact_from = prefix.exact_from
            # n >= MIN_REUSE_TOKENS, so a prefix on a system prompt still shares some of its cells
            seq.system, seq.num_system = prefix.system, min(prefix.num_system, n)
            if n < len(prefix.tokens):
                self._ops.append(CellOp("trim", prefix.seq_id, n))
        seq.num_computed = n
        self.num_committed += seq.num_cells - n

    def _restore(self, seq: Sequence, saved: SavedPrefix, n: int) -> None:
        """The entry's state copied into the sequence's fresh id, cut to the common part: its
        first n tokens are computed (cells already committed by _admit)."""
        self._ops.append(CellOp("restore", seq.seq_id, len(saved.tokens), saved=saved))
        self.op_bytes += saved.nbytes
        if n < len(saved.tokens):
            self._ops.append(CellOp("trim", seq.seq_id, n))
        seq.num_computed = n
        self.num_used += n
        seq.restored_from = saved
        if not usable(len(saved.tokens), 0, self.swa_window):
            seq.exact_from = len(saved.tokens) - 1
        self.host.restored(saved, n)

    def restore_failed(self, seq: Sequence) -> None:
        """The runner could not restore the sequence's prefix: it is prefilled from the start
        (its cells stay committed; the ones the restore filled, if any, are freed)."""
        if seq.restored_from is None or seq.seq_id is None:
            return
        self.num_used -= seq.num_computed
        self.host.unrestored(seq.restored_from, seq.num_computed)  # never again
        seq.num_computed = seq.exact_from = 0
        seq.cached_tokens = 0
        seq.restored_from = None

    def _save(
        self, seq_id: int, tokens: list[int], owner: str, num_prompt: int = 0, exact_from: int = 0
    ) -> SavedPrefix | None:
        """Copy a sequence's cells (`tokens`) into the host tier, before they are freed or
        change hands: a "save" operation the runner fills the entry with. A finished turn
        (`num_prompt`: its prompt's length) of a model with sliding-window layers is also saved
        at its prompt's end (prefix_tiers)."""
        entry = self.host.new_save(tokens, owner)
        if entry is None:
            return None
        self._ops.append(CellOp("save", seq_id, len(tokens), saved=entry))
        self.op_bytes += entry.nbytes
        n = num_prompt
        if n and not usable(len(tokens), n, self.swa_window) and n >= exact_from and self._free_ids:
            checkpoint = self.host.new_save(tokens[:n], owner, twin=entry)
            if checkpoint is not None:  # a copy of its first n cells, saved, then let go
                entry.checkpoint = checkpoint
                spare = self._free_ids[-1]
                self._ops.append(CellOp("copy", seq_id, n, spare))
                self._ops.append(CellOp("save", spare, n, saved=checkpoint))
                self._ops.append(CellOp("free", spare))
                self.op_bytes += checkpoint.nbytes
        return entry

    def emit_saves(self, room_bytes: int | None) -> None:
        """Save finished turns' cached prefixes, oldest first, within `room_bytes` of copies
        (None: all, nothing runs; at least one either way): the rest wait for a later step, in
        the cells. One that must leave the cells before its turn is saved then (`_evict_one`).
        While anything runs, what earlier steps saved leaves first: its ids make checkpoints."""
        if room_bytes is not None and self.shed_saved:
            self._shed()
        spent = 0
        while self._unsaved:
            prefix = self._unsaved[0]
            size = self.host.estimate(len(prefix.tokens)) * (2 if self.swa_window else 1)
            if spent and room_bytes is not None and spent + size > room_bytes:
                return
            spent += size
            self._save_prefix(prefix)

    def _save_prefix(self, prefix: CachedPrefix, save: bool = True) -> None:
        """A finished turn's pending save, made now (or not: its owner's next turn took it)."""
        if prefix.unsaved:
            prefix.unsaved = False
            self._unsaved.remove(prefix)
            if save:
                p = prefix
                p.saved = self._save(p.seq_id, p.tokens, p.owner, p.num_prompt, p.exact_from)

    def _freed_by_takeover(self, match: Match | None) -> int:
        """Cells freed when a taken-over prefix is trimmed to the common part."""
        if match is None or match.prefix is None or match.prefix.is_system:
            return 0
        prefix, n, _ = match
        return prefix.num_own - (n - min(prefix.num_system, n))

    # --- growth and progress ---------------------------------------------------------------

    def ensure(self, seq: Sequence, num_tokens: int) -> bool:
        """Commit cells so the sequence can hold `num_tokens`; evicts cached prefixes first.
        False if the pool is out even with every cached prefix gone."""
        extra = num_tokens - seq.num_cells
        if extra <= 0:
            return True
        if extra > self.num_free and not self._evict_until(extra, 0, keep=None):
            return False
        seq.num_cells += extra
        self.num_committed += extra
        return True

    def spare_cells(self) -> int:
        """Uncommitted cells above the watermark: what drafts may borrow for one step (they
        never evict a cached prefix or preempt anyone)."""
        return max(0, self.num_free - self.num_watermark_cells)

    def settle_draft(self, seq: Sequence, num_ran: int, num_kept: int) -> None:
        """A drafted row ran `num_ran` tokens (its last one and the draft); the first
        `num_kept` stand (the accepted tokens of the reply). The cells it committed beyond
        them are given back, and those llama.cpp filled are trimmed, ahead of anything else
        in the next batch."""
        self.computed(seq, num_kept)
        self.num_committed -= seq.num_cells - seq.num_computed
        seq.num_cells = seq.num_computed
        if num_kept < num_ran and seq.seq_id is not None:
            self._ops.append(CellOp("trim", seq.seq_id, seq.num_computed))

    def computed(self, seq: Sequence, num_tokens: int) -> None:
        """Record that `num_tokens` more of the sequence's tokens are now in the cache."""
        seq.num_computed += num_tokens
        self.num_used += num_tokens
        hint = seq.system_tokens
        if hint and seq.num_computed >= hint:
            seq.system_tokens = 0  # one try: the prompt is in the cache now
            if seq.system is None and self.prefix_caching:
                self._cache_system_prompt(seq, hint)

    def _cache_system_prompt(self, seq: Sequence, n: int) -> None:
        """The sequence's first n cells (a system prompt) become an entry that others copy."""
        if not self._free_ids or n < MIN_REUSE_TOKENS or n < seq.exact_from:
            return  # (a restored state's window cells may not reach back to its end)
        owner = None if seq.system_is_global else seq.user
        tokens = seq.tokens[:n]
        for prefix in self.prefixes:  # one entry per prompt and audience
            if prefix.is_system and prefix.owner == owner and prefix.tokens == tokens:
                return
        self._tick += 1
        seq_id = self._free_ids.pop()
        entry = CachedPrefix(seq_id, tokens, owner, is_system=True, refs=1, last_used=self._tick)
        self.prefixes.append(entry)
        self._ops.append(CellOp("copy", seq.seq_id, n, entry.seq_id))
        seq.system, seq.num_system = entry, n  # the cells now count as the entry's

    # --- release ---------------------------------------------------------------------------

    def release(self, seq: Sequence, keep: bool = False, save: bool = False) -> None:
        """Free what the sequence holds; with `keep`, its computed cells stay as a cached prefix;
        with `keep` or `save`, a copy of them goes to the host tier (when it is long enough)."""
        if seq.seq_id is None:
            return
        self.num_committed -= seq.num_cells - seq.num_computed  # promised, never computed
        own = seq.num_computed - seq.num_system
        tokens = seq.tokens[: seq.num_computed]
        if keep and self.prefix_caching and own > 0 and seq.num_computed >= MIN_REUSE_TOKENS:
            self._tick += 1
            prefix = CachedPrefix(
                seq.seq_id,
                tokens,
                seq.user,
                system=seq.system,
                num_system=seq.num_system,
                last_used=self._tick,
                exact_from=seq.exact_from,
            )
            self.prefixes.append(prefix)
            if self.host.enabled:  # saved in a later step, as the copies' share allows
                prefix.unsaved, prefix.num_prompt = True, seq.num_prompt_tokens
                self._unsaved.append(prefix)
        else:
            if (keep or save) and self.prefix_caching:  # its cells go now: saved first
                self._save(seq.seq_id, tokens, seq.user, 0, seq.exact_from)
            self._drop(own)
            if seq.system is not None:
                seq.system.refs -= 1
            self._free_id(seq.seq_id)
        seq.seq_id, seq.system, seq.num_system, seq.num_cells = None, None, 0, 0
        seq.restored_from, seq.exact_from = None, 0

    def evict_all(self) -> int:
        """Drop every cached prefix that can go (llama.cpp found no room); returns how many."""
        count = 0
        while self._evict_one(keep=None):
            count += 1
        return count

    # --- eviction --------------------------------------------------------------------------

    def _evictable(self, keep: CachedPrefix | None) -> tuple[int, int]:
        """(cells, ids) evicting every cached prefix but `keep` (and its system prompt) frees."""
        cells = ids = 0
        held_by_entries: dict[int, int] = {}
        for prefix in self.prefixes:
            if prefix.system is not None:
                held_by_entries[id(prefix.system)] = held_by_entries.get(id(prefix.system), 0) + 1
        pinned = keep.system if keep is not None else None
        for prefix in self.prefixes:
            if prefix is keep or prefix is pinned:
                continue
            if prefix.is_system and prefix.refs != held_by_entries.get(id(prefix), 0):
                continue  # a live sequence shares its cells
            cells += prefix.num_own
            ids += 1
        return cells, ids

    def _evict_until(self, num_cells: int, num_ids: int, keep: CachedPrefix | None) -> bool:
        """Evict least recently used prefixes until enough cells and ids are free."""
        while self.num_free < num_cells or len(self._free_ids) < num_ids:
            if not self._evict_one(keep):
                return False
        return True

    def _evict_one(self, keep: CachedPrefix | None) -> bool:
        pinned = keep.system if keep is not None else None
        candidates = [
            p
            for p in self.prefixes
            if p is not keep and p is not pinned and not (p.is_system and p.refs > 0)
        ]
        if not candidates:
            return False
        # the tiers' rule (prefix_tiers.victim_order); system prompts are everyone's: they
        # count as their own owner, so they go only as the least recently used
        victim = victim_order(
            candidates,
            lambda p: ("\0system", id(p)) if p.is_system else p.owner,
            lambda p: p.last_used,
            lambda p: p.is_cheap,
        )[0]
        self._evict(victim)
        return True

    def _shed(self) -> None:
        """Cached prefixes the host tier gives back (`covers`) leave the cells (while sequences
        run): every row of a step attends to every cell in use, others' masked but computed
        (20,000 kept cells made a 2,000-token prefill 41% and a decode 11% slower here)."""
        keys, window = self.host.keys, self.swa_window
        for prefix in [p for p in self.prefixes if covers(p.saved, keys, p.num_prompt, window)]:
            self._evict(prefix)

    def _evict(self, victim: CachedPrefix) -> None:
        self._save_prefix(victim)  # not saved yet: now, before its cells go
        self.prefixes.remove(victim)
        self._drop(victim.num_own)
        if victim.system is not None:
            victim.system.refs -= 1
        self._free_id(victim.seq_id)
        self.num_evictions += 1

    def _drop(self, num_cells: int) -> None:
        """Computed cells leave the cache."""
        self.num_used -= num_cells
        self.num_committed -= num_cells

    def _free_id(self, seq_id: int) -> None:
        self._ops.append(CellOp("free", seq_id))
        self._free_ids.append(seq_id)

    # --- for the engine --------------------------------------------------------------------

    def shrink(self, num_cells: int) -> None:
        """Lower the capacity (llama.cpp found fewer cells than we counted)."""
        self.num_cells = max(1, min(self.num_cells, num_cells))

    @property
    def has_ops(self) -> bool:
        """Operations for the next batch, or finished turns' saves waiting to be made."""
        return bool(self._ops or self._unsaved)

    def take_ops(self) -> list[CellOp]:
        """Cell operations decided since the last call, in order, for the runner to apply."""
        ops, self._ops = self._ops, []
        self.op_bytes = 0
        return ops
