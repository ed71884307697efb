"""The prefix cache's tiers below the KV cells: host memory, and the disk behind it.

A finished turn's cells stay in the KV pool as a cached prefix (localserve.engine.kv); its KV
state is also copied out, once, into host memory (`SavedPrefix`, filled by the runner with
llama.cpp's per-sequence state: `llama_state_seq_get_data`), and a sequence preempted for room
leaves its computed cells there the same way. When the cells are needed for someone else the
prefix leaves the pool, but the copy stays: the owner's next turn has it copied back into free
cells (`llama_state_seq_set_data`, milliseconds) instead of prefilled again (seconds on a CPU).
The host tier is bounded in bytes; what leaves it stays on disk if the engine was given a disk
tier (`PrefixDisk`, written behind by localserve.runners.prefix_disk: the engine never touches a
file), so a conversation resumed after hours, or after a restart, starts from its saved KV.

Sliding-window layers (Gemma's five in six): llama.cpp saves only the cells their window still
sees, the last `window` positions. A saved prefix of L tokens therefore goes on exactly only from
L - 1 or L (or from anywhere if L fits in the window): a request sharing fewer of its tokens
cannot use it (`usable`). So that the next turn of a conversation, whose prompt starts with this
turn's prompt but may not re-render the reply token for token, still finds one, a finished
turn of such a model is also saved at its prompt's end (a checkpoint, the same age as the turn).

Every tier keeps the prefix isolation rule: an entry is its owner's, and only a request of that
owner (or any, with share_prefixes = "all") may match it.

Which entry leaves a tier first (`victim_order`), the same rule in every tier and for the KV
pool's cached prefixes (docs/architecture.md, "The prefix cache's tiers"):
1. a prefix that another, newer one of the same owner extends goes at once (nothing can match
   it that does not match the newer one at least as far);
2. then a person's older conversations, before anyone's latest one: keep one prefix per person
   before a second prefix of anyone's;
3. then what is cheap to get back: shorter than `CHEAP_TOKENS` (a short prefill), or, for the
   KV cells, a copy in a lower tier (a restore);
4. then the least recently used.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger("localserve.engine.prefix_tiers")

MIN_SAVE_TOKENS = 128  # shorter prefixes are cheaper to prefill again than to keep and restore
CHEAP_TOKENS = 256  # a prefix this short costs little to prefill again: it leaves a tier early
# a restore must reuse this many more tokens than the cells offer (a read from disk, more than
# the cells and host memory): copying megabytes back for a handful of tokens costs more
MIN_RESTORE_GAIN = 64
DEFAULT_BYTES_PER_TOKEN = 16 << 10  # until the first saved prefix tells the model's own figure


def prefix_key(owner: str | None, tokens: Iterable[int]) -> str:
    """A prefix's name in every tier: its owner and tokens, hashed (the disk file's name)."""
    h = hashlib.blake2b(digest_size=16)
    h.update((owner if owner is not None else "\0").encode() + b"\n")
    for t in tokens:
        h.update(t.to_bytes(4, "little", signed=True))
    return h.hexdigest()


@dataclass(eq=False)
class SavedPrefix:
    """The KV state of tokens[0:len], outside the KV cells (host memory, or a disk file)."""

    tokens: list[int]
    owner: str | None  # whose requests may restore it
    nbytes: int  # its size: an estimate until the runner has copied it out
    key: str = ""
    data: bytes | bytearray | None = None  # None: being saved (this step's operations); b"": failed
    last_used: int = 0
    from_disk: bool = False  # read from the disk tier (counted as a disk hit when restored)
    on_disk: bool = False  # handed to the disk tier
    checkpoint: SavedPrefix | None = None  # a windowed model's copy of its prompt's end

    def __post_init__(self) -> None:
        if not self.key:
            self.key = prefix_key(self.owner, self.tokens)

    @property
    def is_usable(self) -> bool:
        """Saved, or being saved in the same batch's cell operations (applied in order)."""
        return self.data is None or len(self.data) > 0


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def extends(longer: list[int], shorter: list[int]) -> bool:
    return len(longer) >= len(shorter) and longer[: len(shorter)] == shorter


def usable(num_saved: int, num_shared: int, window: int) -> bool:
    """Whether a saved prefix of `num_saved` tokens goes on exactly when `num_shared` of them
    are kept: its sliding-window layers hold only their last `window` positions (0: none)."""
    return not window or num_saved <= window or num_shared >= num_saved - 1


def covers(saved: SavedPrefix | None, keys: frozenset[str], num_prompt: int, window: int) -> bool:
    """Whether the host tier (`keys`) gives a cached prefix back at the cuts its owner's next
    turn asks for: where it ends, and where its prompt ended (a reply rendered otherwise): a
    windowed model's state goes on only from its end, so that cut needs its checkpoint."""
    if saved is None or saved.key not in keys or not saved.is_usable:
        return False
    if usable(len(saved.tokens), num_prompt, window):
        return True
    cut = saved.checkpoint
    return cut is not None and cut.key in keys and cut.is_usable


def victim_order(entries: list, owner: Callable, last_used: Callable, cheap: Callable) -> list:
    """`entries` in the order they should leave (the module's rule, steps 2 to 4): whoever's
    entry is not its owner's most recent first, then the cheap to get back, then the least
    recently used. `cheap(entry)` says whether getting it back costs little."""
    latest: dict[str | None, int] = {}
    for e in entries:
        latest[owner(e)] = max(latest.get(owner(e), -1), last_used(e))
    return sorted(
        entries,
        key=lambda e: (last_used(e) == latest[owner(e)], not cheap(e), last_used(e)),
    )


@dataclass
class TierCounters:
    """What a tier did since the engine started (`/metrics`, the snapshot)."""

    hits: int = 0  # admissions that restored a prefix from it
    restored_tokens: int = 0
    restored_bytes: int = 0
    saved: int = 0  # prefixes copied into it
    saved_bytes: int = 0
    evictions: int = 0  # prefixes that left it for room (superseded ones not counted)
    failures: int = 0  # saves or restores that failed (the tokens were prefilled instead)


class DiskStats(Protocol):
    entries: int
    bytes: int
    budget_bytes: int
    enabled: bool
    evictions: int
    problem: str  # why it is off ("" = on)
    hits: int  # loads that returned an entry
    restored_bytes: int
    saved: int  # entries written
    saved_bytes: int
    failures: int  # files found damaged, cut short or missing when read
    dropped: int  # entries not written: the writer's queue was full


class PrefixDisk(Protocol):
    """The disk tier, as the engine sees it (localserve.runners.prefix_disk implements it)."""

    def put(self, entry: SavedPrefix) -> None:
        """Write the entry behind: queue it, never block (the step's path)."""

    def load(
        self, user: str, tokens: list[int], share_all: bool, skip: frozenset[str], have: int = 0
    ):
        """The longest saved prefix of `tokens` the user may see, read and checked (its data
        set, `from_disk` true), or None; entries whose key is in `skip` are not read (the host
        tier has them), nor any that shares fewer than MIN_RESTORE_GAIN tokens more than `have`
        (what the cells or the host tier offer). Called on the thread that submits the request,
        never the engine's."""

    def stats(self) -> DiskStats: ...

    def close(self) -> None: ...


@dataclass
class HostTier:
    """Saved prefixes in host memory, bounded in bytes. Owned by the engine thread, except
    `keys`, which other threads may read (a frozenset, replaced whole)."""

    budget_bytes: int
    window: int = 0  # the model's sliding window (0: none), for `usable`
    entries: list[SavedPrefix] = field(default_factory=list)
    used_bytes: int = 0
    bytes_per_token: float = DEFAULT_BYTES_PER_TOKEN
    counters: TierCounters = field(default_factory=TierCounters)
    keys: frozenset[str] = frozenset()
    _pending: list[SavedPrefix] = field(default_factory=list)  # saves in this step's ops
    _tick: int = 0

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    @property
    def pending_bytes(self) -> int:
        """What the saves waiting for the next batch's cell operations will copy out."""
        return sum(e.nbytes for e in self._pending)

    def estimate(self, num_tokens: int) -> int:
        return int(num_tokens * self.bytes_per_token)

    def new_save(
        self, tokens: list[int], owner: str | None, twin: SavedPrefix | None = None
    ) -> SavedPrefix | None:
        """An entry for the runner to fill with a sequence's state (a "save" cell operation),
        or None when it is not worth keeping (too short, larger than the whole tier, or the
        entry is here already). A checkpoint of a longer entry (`twin`) is as old as it."""
        if not self.enabled or len(tokens) < MIN_SAVE_TOKENS:
            return None
        entry = SavedPrefix(list(tokens), owner, self.estimate(len(tokens)))
        if entry.nbytes > self.budget_bytes or entry.key in self.keys:
            return None
        self._add(entry)
        if twin is not None:
            entry.last_used = twin.last_used
        self._pending.append(entry)
        return entry

    def adopt(self, entry: SavedPrefix) -> SavedPrefix:
        """A prefix read from the disk tier joins this one (or the copy here already does)."""
        for e in self.entries:
            if e.key == entry.key:
                return e
        if self.enabled and entry.nbytes <= self.budget_bytes:
            self._add(entry)
        return entry

    def _add(self, entry: SavedPrefix) -> None:
        self._tick += 1
        entry.last_used = self._tick
        # a prefix its owner's new one extends can never be the better match: it goes
        for old in [e for e in self.entries if e.owner == entry.owner]:
            if extends(entry.tokens, old.tokens):
                self._remove(old)
        self.entries.append(entry)
        self.used_bytes += entry.nbytes
        self._evict_to(self.budget_bytes, keep=entry)
        self.keys = frozenset(e.key for e in self.entries)

    def settle(self) -> list[SavedPrefix]:
        """After the runner applied the step's cell operations: the saved entries' real sizes,
        the failed ones dropped. Returns the entries saved (for the disk tier)."""
        if not self._pending:
            return []  # (most steps: nothing was saved)
        saved, self._pending = self._pending, []
        done = []
        for entry in saved:
            if entry.data is None:  # its operation never ran (the step failed first)
                entry.data = b""
            if not entry.data:
                self.counters.failures += 1
                self._remove(entry)
                continue
            size = len(entry.data)
            self.bytes_per_token = size / max(1, len(entry.tokens))
            if entry in self.entries:
                self.used_bytes += size - entry.nbytes
            entry.nbytes = size
            self.counters.saved += 1
            self.counters.saved_bytes += size
            done.append(entry)
        self._evict_to(self.budget_bytes)
        self.keys = frozenset(e.key for e in self.entries)
        return done

    def match(
        self, tokens: list[int], user: str, share_all: bool, limit: int
    ) -> tuple[SavedPrefix, int] | None:
        """The entry the tokens share the longest prefix with (at most `limit`), among those
        the user may see."""
        best: tuple[SavedPrefix, int] | None = None
        for entry in self.entries:
            if not (share_all or entry.owner is None or entry.owner == user):
                continue
            if not entry.is_usable:
                continue
            n = min(common_prefix(entry.tokens, tokens), limit)
            if not usable(len(entry.tokens), n, self.window):
                continue
            if best is None or n > best[1]:
                best = (entry, n)
        return best

    def touch(self, entry: SavedPrefix) -> None:
        self._tick += 1
        entry.last_used = self._tick

    def restored(self, entry: SavedPrefix, num_tokens: int) -> None:
        self.touch(entry)
        self.counters.hits += 1
        self.counters.restored_tokens += num_tokens
        self.counters.restored_bytes += entry.nbytes

    def unrestored(self, entry: SavedPrefix, num_tokens: int) -> None:
        """A restore counted at admission that the runner could not make: the entry is never
        offered again (its bytes leave the budget)."""
        self.counters.failures += 1
        self.counters.hits -= 1
        self.counters.restored_tokens -= num_tokens
        self.counters.restored_bytes -= entry.nbytes
        entry.data = b""
        self._remove(entry)
        self.keys = frozenset(e.key for e in self.entries)

    def _evict_to(self, budget: int, keep: SavedPrefix | None = None) -> None:
        if self.used_bytes <= budget:
            return
        order = victim_order(
            [e for e in self.entries if e is not keep],
            lambda e: e.owner,
            lambda e: e.last_used,
            lambda e: len(e.tokens) < CHEAP_TOKENS,
        )
        for victim in order:
            if self.used_bytes <= budget:
                break
            self._remove(victim)
            self.counters.evictions += 1

    def _remove(self, entry: SavedPrefix) -> None:
        if entry in self.entries:
            self.entries.remove(entry)
            self.used_bytes -= entry.nbytes


# saved prefixes copied in and out of the cells per second, until measured (llama.cpp's state
# copy on this CPU: ~5 GB/s; a GPU's copy over PCIe is of the same order)
COPY_BYTES_PER_S = 2e9
COPY_SHARE = 0.5  # of the ITL target, what a step's restores may take (at least one restore)


@dataclass
class CopyPace:
    """The step's copies of saved prefixes (saves and restores), priced at their measured rate:
    restores and saves are spread over steps, at most COPY_SHARE of the ITL target each (but
    always one of each), and the prefill budget gets the target less the copies' time (the
    scheduler's)."""

    rate: float = COPY_BYTES_PER_S

    def seconds(self, nbytes: int) -> float:
        return nbytes / self.rate

    def room(self, planned_bytes: int, itl_target_s: float) -> int:
        """Bytes a step that already copies `planned_bytes` may still copy."""
        return max(0, int(COPY_SHARE * itl_target_s * self.rate) - planned_bytes)

    def learn(self, moved_bytes: int, seconds: float) -> None:
        """What a step's copies took: their own rate (the step-cost fit learns the rest)."""
        if moved_bytes and seconds > 0:
            self.rate += 0.2 * (moved_bytes / seconds - self.rate)


READ_WAIT_S = 5.0  # a disk read taking longer is given up: the request prefills instead


class DiskReads:
    """Requests waiting for the disk tier to read their saved prefix (on its thread): they
    join the queue when it is read (their prefix into the host tier) or when it fails."""

    def __init__(self, share_all: bool = False) -> None:
        self.share_all = share_all
        self.waiting: list[tuple[object, Future]] = []

    def start(self, disk: PrefixDisk | None, seq, kv, wake) -> Future | None:
        """The disk's read of the sequence's longest saved prefix, when it is longer than what
        the cells and the host tier offer (`kv`, a KVPool, read from the submitting thread:
        a glance at lists the engine thread changes, good enough to skip a needless read);
        None: no read. `wake` is called when it is done."""
        if disk is None:
            return None
        found = kv.match(seq)
        have = found.num_tokens if found is not None else 0
        loading = disk.load(seq.user, seq.tokens, self.share_all, kv.host.keys, have)
        if loading is not None:
            loading.add_done_callback(wake)
        return loading

    def add(self, seq, loading: Future, now: float) -> None:
        self.waiting.append((seq, loading, now + READ_WAIT_S))

    @property
    def wait_s(self) -> float | None:
        """How long an idle engine may sleep: a read is given up after READ_WAIT_S."""
        return READ_WAIT_S if self.waiting else None

    def ready(self, now: float) -> list[tuple[object, SavedPrefix | None]]:
        """The sequences whose read is over, with what it gave (None: nothing, it failed, or
        it took longer than READ_WAIT_S: a stuck disk never holds a request); those cancelled
        meanwhile are left out (their Done went with the cancel)."""
        out, still = [], []
        for seq, loading, deadline in self.waiting:
            done = loading.done()  # once: the reader may finish it meanwhile
            if not done and now < deadline:
                still.append((seq, loading, deadline))
            elif not (seq.is_finished or seq.is_cancelled):
                out.append((seq, _result(loading) if done else None))
                if not done:
                    log.warning("reading a saved prefix took over %.0f s: prefilled", READ_WAIT_S)
        self.waiting = still
        return out


def _result(loading: Future) -> SavedPrefix | None:
    try:
        return loading.result()
    except Exception:
        log.exception("reading a saved prefix failed")
        return None
