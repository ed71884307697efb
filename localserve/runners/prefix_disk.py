"""The prefix cache's disk tier: saved KV states written behind to files, read back on demand.

`PrefixDiskTier` is engine/prefix_tiers.py's `PrefixDisk`: the engine hands it each prefix its
host tier saved (`put`, on the step's path: only queued) and asks it, on the thread that submits
a request, for the longest saved prefix of the request's tokens (`load`: a Future, read on the
reader thread). The files, where they are and what a state depends on (its identity) are
runners/prefix_files.py's: a start removes every other identity's directory (a new model file
or build: never restored) and the temporary files a killed writer left. The owner is in each
file's name and header, and a load returns only what the user may see (their own entries,
ownerless ones, anyone's with share_prefixes = "all"); a file read back is checked whole, and a
damaged, cut or missing one is removed with one warning line (its tokens are prefilled instead).

Threads: one writer (entries queued by `put`: a bounded queue, an entry that finds it full is
dropped) and one reader (the loads), both daemons. The index (key -> owner, tokens, size, last
use), built at start from the files' headers alone, is shared by them and the submitting thread
under one lock. The budget is held after each write: the owner's entries the new one extends go
at once, then entries leave in prefix_tiers.victim_order.

Nothing here fails a request or the server: a write that fails (a full disk, a read-only or
foreign directory) turns the tier off with one warning line (only caching is lost); a directory
deleted under it is made again at the next write. The budgets (`cache_budgets`) and the opening
of a model's tiers (`open_prefix_tiers`) are here too.

Tested in tests/unit/runners/test_prefix_disk.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import shutil
import stat
import threading
import time
from array import array
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from localserve.config import Config, ModelConfig
from localserve.engine.prefix_tiers import (
    CHEAP_TOKENS,
    MIN_RESTORE_GAIN,
    SavedPrefix,
    common_prefix,
    extends,
    usable,
    victim_order,
)
from localserve.engine.runner import Runner
from localserve.ops.usage import state_dir
from localserve.runners.footprint import MAX_AUTO_CACHE, MIB, host_cache_bytes
from localserve.runners.models import resolve_model
from localserve.runners.prefix_files import (
    SUFFIX,
    TEMP_SUFFIX,
    UnsoundFile,
    file_bytes,
    identity_digest,
    model_dir,
    model_identity,
    read_file,
    read_header,
    write_file,
)

log = logging.getLogger("localserve.runners.prefix_disk")

MIN_LOAD_TOKENS = 64  # a shorter common prefix is prefilled rather than read and restored
MAX_QUEUED = 16  # entries waiting for the writer; one more is dropped (only caching is lost)
CLOSE_WRITE_S = 2.0  # how long close() goes on writing what is queued
DISK_CACHE_SHARE = 0.10  # the auto budget: of the free space where the state directory is


class _Refused(Exception):
    """A directory the tier will not write in (not one, another user's, writable by others)."""


@dataclass(eq=False)
class _Entry:
    """A saved prefix in the index: what its header says, its file's size, its last use."""

    key: str
    owner: str | None
    tokens: array  # int32: a tenth of a list's memory for thousands of tokens
    size: int
    last_used: int  # ns since the epoch: the file's mtime at start, then each write and load


@dataclass(frozen=True)
class DiskTierStats:
    """The disk tier now (prefix_tiers.DiskStats): what it holds, and what it did since start."""

    entries: int
    bytes: int
    budget_bytes: int
    enabled: bool
    problem: str  # why it is off ("" = on, or never asked to be: budget 0)
    hits: int  # loads that returned an entry
    restored_bytes: int
    saved: int  # files written
    saved_bytes: int
    evictions: int  # files removed for room (superseded ones not counted)
    failures: int  # files found damaged, cut short or missing when read
    dropped: int  # entries not written: the writer's queue was full


class PrefixDiskTier:
    """One model's saved prefixes on disk (the module's docstring). `identity`: everything its
    states depend on (`model_identity`); `budget_bytes`: the most its files may hold."""

    def __init__(
        self, state: Path, model: str, identity: dict, budget_bytes: int, window: int = 0
    ) -> None:
        """`window`: the model's sliding window (0: none): a saved state goes on exactly only
        from its end then (prefix_tiers.usable), so a shorter match cannot use it."""
        self.window = window
        self.identity = identity_digest(identity)
        self.dir = model_dir(state, model) / self.identity
        # each level from the state directory down: checked, and made 0700 when missing
        self._levels = [state, state / "kv-cache", self.dir.parent, self.dir]
        self.budget_bytes = budget_bytes
        self.problem = ""
        self._lock = threading.Lock()  # the index, its bytes and the counters
        self._index: dict[str, _Entry] = {}
        self._bytes = 0
        self._counts = dict.fromkeys(
            ("hits", "restored_bytes", "saved", "saved_bytes", "evictions", "failures", "dropped"),
            0,
        )
        self._writes: queue.Queue[SavedPrefix | None] = queue.Queue(MAX_QUEUED)
        self._reads: queue.SimpleQueue = queue.SimpleQueue()
        self._accepting = budget_bytes > 0
        self._write_until = float("inf")  # close() sets how long what is queued is still written
        self._threads: list[threading.Thread] = []
        if not self._accepting:
            return
        try:
            self._make_dirs()
            self._remove_foreign()
            self._read_index()
        except (OSError, _Refused) as e:
            self._turn_off(f"cannot use {self.dir}: {_why(e)}")
            return
        for target, role in ((self._write_loop, "writer"), (self._read_loop, "reader")):
            # daemons: a thread stuck on a dead disk must not keep the process from exiting
            thread = threading.Thread(target=target, name=f"localserve-kv-{role}", daemon=True)
            thread.start()
            self._threads.append(thread)

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0 and not self.problem

    # --- the engine's side (prefix_tiers.PrefixDisk) --------------------------------------

    def put(self, entry: SavedPrefix) -> None:
        """Queue a saved entry for the writer; never blocks (a full queue drops it)."""
        if not (self._accepting and self.enabled and entry.data):
            return
        if file_bytes(entry) > self.budget_bytes:  # it could never stay
            return
        try:
            self._writes.put_nowait(entry)
        except queue.Full:
            with self._lock:
                self._counts["dropped"] += 1
            return
        entry.on_disk = True

    def load(
        self, user: str, tokens: list[int], share_all: bool, skip: frozenset[str], have: int = 0
    ) -> Future[SavedPrefix | None] | None:
        """The entry sharing the longest prefix with `tokens` (at least MIN_LOAD_TOKENS, at most
        all but the last token) among those the user may see and `skip` does not name: a Future
        the reader resolves with it read and checked (None when it is not sound); None at once
        when there is no such entry."""
        wanted, limit = array("i", tokens), len(tokens) - 1  # the last token is always computed
        with self._lock:
            if not (self._accepting and self.enabled):
                return None
            # worth a read only when it gives clearly more than the cells or host memory do
            best, best_n = None, max(MIN_LOAD_TOKENS, have + MIN_RESTORE_GAIN) - 1
            for e in self._index.values():
                if e.key in skip or not (share_all or e.owner is None or e.owner == user):
                    continue
                n = min(common_prefix(e.tokens, wanted), limit)
                if n > best_n and usable(len(e.tokens), n, self.window):
                    best, best_n = e, n
            if best is None:
                return None
            best.last_used = time.time_ns()
        future: Future[SavedPrefix | None] = Future()
        self._reads.put((best, future))
        return future

    def stats(self) -> DiskTierStats:
        with self._lock:
            return DiskTierStats(
                entries=len(self._index),
                bytes=self._bytes,
                budget_bytes=self.budget_bytes,
                enabled=self.enabled,
                problem=self.problem,
                **self._counts,
            )

    def flush(self) -> None:
        """Wait until every queued entry is written (or dropped): tests and benchmarks."""
        self._writes.join()

    def close(self) -> None:
        """Stop taking entries, write what is queued for CLOSE_WRITE_S at most, end the
        threads (the reads asked for before are answered)."""
        if not self._threads:
            self._accepting = False
            return
        self._accepting = False
        self._write_until = time.monotonic() + CLOSE_WRITE_S
        with contextlib.suppress(queue.Full):  # the writer stuck on a dead disk: left behind
            self._writes.put(None, timeout=CLOSE_WRITE_S)
        self._reads.put(None)
        for thread in self._threads:
            thread.join(max(0.1, self._write_until - time.monotonic()))
        self._threads = []

    # --- the directories and the index -----------------------------------------------------

    def _make_dirs(self) -> None:
        """Each level made 0700 when missing; _Refused when one is not a directory of this
        user's, or others may write in it (they could plant states we would restore)."""
        self._levels[0].parent.mkdir(parents=True, exist_ok=True)
        for level in self._levels:
            with contextlib.suppress(FileExistsError):
                level.mkdir(mode=0o700)
            st = level.stat()
            if not stat.S_ISDIR(st.st_mode):
                raise _Refused(f"{level} is not a directory")
            if st.st_uid != os.geteuid():
                raise _Refused(f"{level} belongs to another user (uid {st.st_uid})")
            if st.st_mode & 0o022:
                raise _Refused(f"others may write in {level} (mode {st.st_mode & 0o777:o})")

    def _remove_foreign(self) -> None:
        """Other identities' directories (states no context of ours takes), and the temporary
        files a killed writer left in ours."""
        for path in self.dir.parent.iterdir():
            if path.name != self.identity and path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
        for path in self.dir.iterdir():
            if path.name.endswith(TEMP_SUFFIX):
                path.unlink(missing_ok=True)

    def _read_index(self) -> None:
        """The index from the files' headers; a file that is not a sound entry of ours goes."""
        removed = 0
        for path in self.dir.glob("*" + SUFFIX):
            entry = self._indexed(path)
            if entry is None:
                path.unlink(missing_ok=True)
                removed += 1
                continue
            self._index[entry.key] = entry
            self._bytes += entry.size
        if removed:
            log.info(
                "prefix cache: %d unreadable or foreign files removed from %s", removed, self.dir
            )
        for victim in self._evict():  # a budget smaller than last time
            self._path(victim.key).unlink(missing_ok=True)

    def _indexed(self, path: Path) -> _Entry | None:
        """The file's index entry from its header, or None: not a sound entry of ours."""
        try:
            header, st = read_header(path, self.identity)
        except (OSError, UnsoundFile):
            return None
        tokens = array("i", header.tokens)
        return _Entry(path.stem, header.owner, tokens, st.st_size, st.st_mtime_ns)

    def _path(self, key: str) -> Path:
        return self.dir / f"{key}{SUFFIX}"

    # --- the writer ------------------------------------------------------------------------

    def _write_loop(self) -> None:
        # the writes are behind the engine: this thread gives way to its threads for the CPU
        # (Linux: a thread's own nice value), so hashing and writing megabytes never slow a step
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while True:
            entry = self._writes.get()
            try:
                if entry is None:
                    return
                if self.enabled and time.monotonic() < self._write_until:
                    self._write(entry)
            except Exception:  # never die silently: this entry is lost, the next is written
                log.exception("prefix cache: writing %s failed", entry.key if entry else "")
            finally:
                self._writes.task_done()

    def _write(self, entry: SavedPrefix) -> None:
        try:
            if not self.dir.is_dir():  # deleted under us (a clean-up): made again, empty
                self._forget_all()
                self._make_dirs()
            size = write_file(self._path(entry.key), self.identity, entry)
        except (OSError, _Refused) as e:  # a full disk, a read-only one, a foreign directory
            self._turn_off(f"cannot write in {self.dir}: {_why(e)}")
            return
        self._add(entry, size)

    def _add(self, entry: SavedPrefix, size: int) -> None:
        """The written entry joins the index; the owner's entries it extends leave, then what
        is over the budget, in victim_order."""
        new = _Entry(entry.key, entry.owner, array("i", entry.tokens), size, time.time_ns())
        with self._lock:
            self._counts["saved"] += 1
            self._counts["saved_bytes"] += size
            self._forget(self._index.get(new.key))  # rewritten: the file is the new one
            gone = [
                e
                for e in self._index.values()
                if e.owner == new.owner and extends(new.tokens, e.tokens)
            ]
            for e in gone:
                self._forget(e)
            self._index[new.key] = new
            self._bytes += size
            gone += self._evict(keep=new)
        for e in gone:
            with contextlib.suppress(OSError):
                self._path(e.key).unlink(missing_ok=True)

    def _evict(self, keep: _Entry | None = None) -> list[_Entry]:
        """Entries out of the index until it fits the budget (with the lock held, or alone)."""
        if self._bytes <= self.budget_bytes:
            return []
        order = victim_order(
            [e for e in self._index.values() if e is not keep],
            lambda e: e.owner,
            lambda e: e.last_used,
            lambda e: len(e.tokens) < CHEAP_TOKENS,
        )
        gone = []
        for victim in order:
            if self._bytes <= self.budget_bytes:
                break
            self._forget(victim)
            self._counts["evictions"] += 1
            gone.append(victim)
        return gone

    def _forget(self, entry: _Entry | None) -> None:
        if entry is not None and self._index.get(entry.key) is entry:
            del self._index[entry.key]
            self._bytes -= entry.size

    def _forget_all(self) -> None:
        with self._lock:
            self._index.clear()
            self._bytes = 0

    def _turn_off(self, why: str) -> None:
        """Off for good, said once: only caching is lost."""
        with self._lock:
            if self.problem:
                return
            self.problem = why
        log.warning(
            "prefix cache on disk off: %s (only caching is lost: conversations are prefilled "
            "again or restored from memory)",
            why,
        )

    # --- the reader ------------------------------------------------------------------------

    def _read_loop(self) -> None:
        while True:
            item = self._reads.get()
            if item is None:
                return
            entry, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                saved = self._read(entry)
            except Exception:  # never leave a request waiting: it prefills instead
                log.exception("prefix cache: reading %s failed", entry.key)
                saved = None
            future.set_result(saved)

    def _read(self, entry: _Entry) -> SavedPrefix | None:
        """The entry's file read whole and checked; None (and the file removed) when it is
        not sound."""
        path = self._path(entry.key)
        try:
            header, data = read_file(path, self.identity)
        except FileNotFoundError:
            self._discard(entry, path, "missing")
            return None
        except (OSError, UnsoundFile) as e:
            self._discard(entry, path, _why(e))
            return None
        with self._lock:
            self._counts["hits"] += 1
            self._counts["restored_bytes"] += len(data)
        with contextlib.suppress(OSError):
            os.utime(path)  # its last use, for the order of eviction after a restart
        return SavedPrefix(
            tokens=header.tokens,
            owner=header.owner,
            nbytes=len(data),
            key=entry.key,
            data=data,
            from_disk=True,
            on_disk=True,
        )

    def _discard(self, entry: _Entry, path: Path, problem: str) -> None:
        with self._lock:
            if self._index.get(entry.key) is not entry:
                return  # evicted or rewritten while it was read: nothing is wrong
            self._forget(entry)
            self._counts["failures"] += 1
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        log.warning(
            "prefix cache: %s: %s; removed (its tokens are prefilled instead)", path, problem
        )


# --- budgets and opening ----------------------------------------------------------------------


def _why(e: BaseException) -> str:
    """An error in words: an OSError's text without its errno number."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    return str(e)


def cache_budgets(cfg: ModelConfig, state: Path) -> tuple[int, int]:
    """(host, disk) tier budgets in bytes: models.toml's host_cache_mib and disk_cache_mib, or
    (-1, auto) footprint.host_cache_bytes (an eighth of the available RAM, at most 2 GiB) and a
    tenth of the state directory's free space, at most MAX_AUTO_CACHE; 0 = off (an embedding
    model has neither)."""
    host = host_cache_bytes(cfg)
    if cfg.kind == "embedding" or cfg.disk_cache_mib == 0:
        return host, 0
    if cfg.disk_cache_mib > 0:
        return host, cfg.disk_cache_mib * MIB
    return host, min(int(_free_space(state) * DISK_CACHE_SHARE), MAX_AUTO_CACHE)


def _free_space(path: Path) -> int:
    """Free bytes on the file system that holds `path`, or will (its nearest existing parent)."""
    for where in (path, *path.parents):
        with contextlib.suppress(OSError):
            return shutil.disk_usage(where).free
    return 0


def open_prefix_tiers(
    config: Config, name: str, runner: Runner
) -> tuple[int, PrefixDiskTier | None]:
    """A model's engine's tiers (engine_process/child.py, serve/serving.py): the host tier's
    budget in bytes and the disk tier. Neither without prefix caching; no disk tier without a
    host tier (it is written from it), a disk budget, or a model file to identify states by."""
    cfg = config.models[name]
    if not (config.scheduler.prefix_caching and runner.supports_prefix_reuse):
        return 0, None
    if runner.info.is_embedding_only:
        return 0, None
    state = state_dir(config.server)
    host, disk = cache_budgets(cfg, state)
    if host <= 0 or disk <= 0:
        return host, None
    try:
        identity = model_identity(resolve_model(name, cfg), cfg, runner)
    except (OSError, ValueError) as e:  # ValueError: a ConfigError (the file is gone)
        log.warning("prefix cache on disk off for %s: %s", name, e)
        return host, None
    window = getattr(runner, "swa_window", 0)
    return host, PrefixDiskTier(state, name, identity, disk, window)
