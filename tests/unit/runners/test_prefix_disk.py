"""The prefix cache's disk tier (runners/prefix_disk.py) on saved prefixes of made-up bytes and a
stand-in identity: what is written is read back, only by its owner; damaged, cut, foreign and
misnamed files are removed; the budget holds; a failing disk turns it off and nothing fails; a
restart finds what was written. And the budgets models.toml's keys resolve to."""

from __future__ import annotations

import errno
import logging
import os
import resource
import signal
from pathlib import Path

import pytest
from msgspec.structs import replace

from localserve.config import (
    Config,
    ConfigError,
    ModelConfig,
    SchedulerConfig,
    ServerConfig,
    parse_config,
)
from localserve.engine.prefix_tiers import SavedPrefix, prefix_key
from localserve.runners import footprint, prefix_disk
from localserve.runners.fake import FakeRunner
from localserve.runners.prefix_disk import (
    MIN_LOAD_TOKENS,
    MIN_RESTORE_GAIN,
    PrefixDiskTier,
    cache_budgets,
    open_prefix_tiers,
)
from localserve.runners.prefix_files import TEMP_SUFFIX, model_dir

IDENTITY = {"model": "stand-in.gguf", "n_ctx": 4096, "cache_type_k": "f16"}
MIB = 1 << 20


@pytest.fixture
def tiers():
    """Opens tiers (`tiers(state, ...)`) and closes them after the test."""
    opened: list[PrefixDiskTier] = []

    def open_tier(state: Path, budget: int = MIB, identity: dict = IDENTITY, model: str = "m"):
        tier = PrefixDiskTier(state, model, identity, budget)
        opened.append(tier)
        return tier

    yield open_tier
    for tier in opened:
        tier.close()


def saved(owner: str | None, n: int = 200, start: int = 1, size: int = 1000) -> SavedPrefix:
    """A saved prefix of tokens start..start+n-1 whose state is `size` bytes that say whose."""
    tokens = list(range(start, start + n))
    data = (f"{owner}:{start}:{n}|".encode() * size)[:size]
    return SavedPrefix(tokens, owner, len(data), data=data)


def written(tier: PrefixDiskTier, *entries: SavedPrefix) -> None:
    for entry in entries:
        tier.put(entry)
        tier.flush()


def loaded(tier: PrefixDiskTier, user: str, tokens: list[int], share_all: bool = False, skip=()):
    future = tier.load(user, tokens, share_all, frozenset(skip))
    return None if future is None else future.result(timeout=5)


def files(tier: PrefixDiskTier) -> list[Path]:
    return sorted(tier.dir.glob("*.kv"))


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --- writing and reading ---------------------------------------------------------------------


def test_a_written_prefix_is_read_back_with_the_same_bytes(tmp_path, tiers):
    tier = tiers(tmp_path)
    entry = saved("alice")
    written(tier, entry)
    assert entry.on_disk
    [path] = files(tier)
    assert path.name == f"{prefix_key('alice', entry.tokens)}.kv"
    assert path.stat().st_mode & 0o777 == 0o600 and tier.dir.stat().st_mode & 0o777 == 0o700
    back = loaded(tier, "alice", entry.tokens + [7, 8, 9])  # the next turn: the prefix and more
    assert back.data == entry.data and back.tokens == entry.tokens and back.owner == "alice"
    assert back.key == entry.key and back.from_disk and back.on_disk and back.nbytes == 1000
    stats = tier.stats()
    assert (stats.entries, stats.hits, stats.restored_bytes, stats.saved) == (1, 1, 1000, 1)
    assert stats.bytes == path.stat().st_size and stats.enabled and stats.problem == ""


def test_another_owner_never_loads_it(tmp_path, tiers):
    tier = tiers(tmp_path)
    entry = saved("alice")
    written(tier, entry, saved(None, start=10_000))
    assert tier.load("bob", entry.tokens + [1], False, frozenset()) is None
    assert loaded(tier, "bob", entry.tokens + [1], share_all=True).data == entry.data
    assert loaded(tier, "bob", list(range(10_000, 10_200))).owner is None  # nobody's: anyone's


def test_only_a_long_enough_prefix_not_skipped_is_read(tmp_path, tiers):
    tier = tiers(tmp_path)
    entry = saved("alice")
    written(tier, entry)
    short = entry.tokens[: MIN_LOAD_TOKENS - 1] + [-5] * 100
    assert tier.load("alice", short, False, frozenset()) is None
    assert tier.load("alice", entry.tokens + [1], False, frozenset({entry.key})) is None
    # at most all but the last token: that one's logits sample the reply
    assert loaded(tier, "alice", entry.tokens[: MIN_LOAD_TOKENS + 1]) is not None
    assert tier.load("alice", entry.tokens[:MIN_LOAD_TOKENS], False, frozenset()) is None


def test_nothing_is_read_that_gives_little_more_than_the_cells_or_host_memory(tmp_path, tiers):
    tier = tiers(tmp_path)
    entry = saved("alice", n=300)
    written(tier, entry)
    prompt = entry.tokens + [1]
    # the cells hold 250 of its tokens already: 50 more are not worth megabytes read
    assert tier.load("alice", prompt, False, frozenset(), have=250) is None
    found = tier.load("alice", prompt, False, frozenset(), have=300 - MIN_RESTORE_GAIN)
    assert found is not None and found.result(timeout=5).tokens == entry.tokens


def test_a_sliding_window_model_s_state_is_read_only_where_it_goes_on_exactly(tmp_path):
    tier = PrefixDiskTier(tmp_path, "m", IDENTITY, MIB, window=64)
    try:
        entry = saved("alice", n=300)
        written(tier, entry)
        cut = entry.tokens[:250] + [-1] * 10  # its window's cells would be missing
        assert tier.load("alice", cut, False, frozenset()) is None
        assert loaded(tier, "alice", entry.tokens + [1]).tokens == entry.tokens
    finally:
        tier.close()


def test_the_longest_prefix_is_chosen_and_an_extended_one_replaced(tmp_path, tiers):
    tier = tiers(tmp_path)
    first, other = saved("alice", n=150), saved("alice", n=300, start=5_000)
    written(tier, first, other)
    assert loaded(tier, "alice", list(range(5_000, 5_400))).key == other.key
    longer = saved("alice", n=250)  # the first conversation's next turn: it extends `first`
    written(tier, longer)
    assert {p.stem for p in files(tier)} == {longer.key, other.key}
    assert loaded(tier, "alice", list(range(1, 400))).key == longer.key


# --- what is not sound -----------------------------------------------------------------------


def test_a_damaged_byte_is_found_and_the_file_removed(tmp_path, tiers, caplog):
    tier = tiers(tmp_path)
    entry = saved("alice")
    written(tier, entry)
    [path] = files(tier)
    raw = bytearray(path.read_bytes())
    raw[-10] ^= 0xFF
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING):
        assert loaded(tier, "alice", entry.tokens + [1]) is None
    assert files(tier) == [] and tier.stats().entries == 0 and tier.stats().failures == 1
    [line] = warnings(caplog)
    assert "damaged (checksum)" in line and path.name in line
    assert tier.load("alice", entry.tokens + [1], False, frozenset()) is None  # gone for good


def test_a_truncated_file_is_removed_when_read_and_at_start(tmp_path, tiers, caplog):
    tier = tiers(tmp_path)
    one, two = saved("alice"), saved("bob")
    written(tier, one, two)
    for entry in (one, two):
        path = tier.dir / f"{entry.key}.kv"
        path.write_bytes(path.read_bytes()[:-100])
    with caplog.at_level(logging.WARNING):
        assert loaded(tier, "alice", one.tokens + [1]) is None  # read: cut short
    assert "cut short" in warnings(caplog)[0]
    tier.close()
    again = tiers(tmp_path)  # a restart: bob's is found short by its size alone
    assert files(again) == [] and again.stats().entries == 0


def test_another_identity_is_removed_at_start_and_another_model_kept(tmp_path, tiers):
    old = tiers(tmp_path)
    written(old, saved("alice"))
    other_model = tiers(tmp_path, model="other")
    written(other_model, saved("alice"))
    old.close()
    new = tiers(tmp_path, identity=IDENTITY | {"n_ctx": 8192})  # a new context size
    assert not old.dir.exists() and new.stats().entries == 0
    assert files(other_model) != []
    assert new.load("alice", saved("alice").tokens + [1], False, frozenset()) is None


def test_a_file_named_for_another_key_or_not_ours_is_removed_at_start(tmp_path, tiers):
    tier = tiers(tmp_path)
    entry = saved("alice")
    written(tier, entry)
    [path] = files(tier)
    bobs = tier.dir / f"{prefix_key('bob', entry.tokens)}.kv"  # alice's state under bob's name
    bobs.write_bytes(path.read_bytes())
    (tier.dir / f"{prefix_key('carol', [1, 2])}.kv").write_bytes(b"not a saved prefix")
    tier.close()
    again = tiers(tmp_path)
    assert files(again) == [path]
    assert again.load("bob", entry.tokens + [1], False, frozenset()) is None


def test_a_temporary_file_left_by_a_killed_writer_is_removed_and_never_read(tmp_path, tiers):
    tier = tiers(tmp_path)
    entry = saved("alice")
    written(tier, entry)
    full = files(tier)[0].read_bytes()
    tier.close()
    files(tier)[0].unlink()
    stray = tier.dir / f".{entry.key}.4242{TEMP_SUFFIX}"  # SIGKILL halfway through the write
    stray.write_bytes(full[: len(full) // 2])
    again = tiers(tmp_path)
    assert not stray.exists() and again.stats().entries == 0
    assert again.load("alice", entry.tokens + [1], False, frozenset()) is None


# --- the budget ------------------------------------------------------------------------------


def test_the_budget_holds_under_a_flood_of_owners(tmp_path, tiers):
    budget = 40_000
    tier = tiers(tmp_path, budget=budget)
    for i in range(200):
        written(tier, saved(f"user{i}", start=i * 1000, size=3000))
    on_disk = sum(p.stat().st_size for p in files(tier))
    stats = tier.stats()
    assert on_disk == stats.bytes <= budget and stats.entries == len(files(tier)) > 5
    assert stats.evictions == 200 - stats.entries and stats.saved == 200
    assert loaded(tier, "user199", list(range(199_000, 199_300))) is not None  # the newest stays


def test_a_person_s_older_conversation_leaves_before_anyone_s_latest(tmp_path, tiers):
    tier = tiers(tmp_path)
    alice_old, bob = saved("alice", size=1000), saved("bob", start=1000, size=1000)
    alice_new = saved("alice", start=2000, size=1000)
    written(tier, alice_old, bob, alice_new)
    tier.budget_bytes = tier.stats().bytes + 500  # room for three: the fourth makes one go
    carol = saved("carol", start=3000, size=1000)
    written(tier, carol)
    assert {p.stem for p in files(tier)} == {bob.key, alice_new.key, carol.key}
    assert tier.stats().evictions == 1


def test_a_full_queue_drops_entries_without_an_error(tmp_path, tiers, monkeypatch):
    tier = tiers(tmp_path)
    monkeypatch.setattr(tier, "_write", lambda entry: None)  # a writer that never catches up
    monkeypatch.setattr(tier._writes, "put_nowait", _always_full)
    entry = saved("alice")
    tier.put(entry)
    assert tier.stats().dropped == 1 and not entry.on_disk


def _always_full(item):
    import queue

    raise queue.Full


# --- a failing disk --------------------------------------------------------------------------


def test_a_full_disk_turns_it_off_with_one_line_and_nothing_fails(tmp_path, tiers, caplog):
    tier = tiers(tmp_path)
    written(tier, saved("alice"))

    def no_space(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with caplog.at_level(logging.WARNING):
        os_replace = os.replace
        os.replace = no_space
        try:
            written(tier, saved("bob"), saved("carol"))
        finally:
            os.replace = os_replace
        tier.put(saved("dave"))  # off: taken and ignored
        assert tier.load("alice", saved("alice").tokens + [1], False, frozenset()) is None
    [line] = warnings(caplog)
    assert "No space left on device" in line and "only caching is lost" in line
    stats = tier.stats()
    assert not stats.enabled and "No space left on device" in stats.problem
    assert [p.name for p in tier.dir.iterdir() if p.name.endswith(TEMP_SUFFIX)] == []


def test_a_file_size_limit_the_kernel_enforces_turns_it_off(tmp_path, tiers, caplog):
    """A real failing write: RLIMIT_FSIZE makes the kernel refuse (EFBIG) past 4 KiB."""
    tier = tiers(tmp_path)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with caplog.at_level(logging.WARNING):
            written(tier, saved("alice", size=8000))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert len(warnings(caplog)) == 1 and "File too large" in tier.stats().problem
    assert list(tier.dir.iterdir()) == []  # the temporary file removed


def test_a_state_directory_others_may_write_in_or_that_cannot_be_made_is_refused(
    tmp_path, tiers, caplog
):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with caplog.at_level(logging.WARNING):
        tier = tiers(shared)
        nowhere = tiers(Path("/proc/localserve-test/state"))  # /proc takes no new directory
        not_a_dir = tmp_path / "file"
        not_a_dir.write_text("")
        on_a_file = tiers(not_a_dir)
    assert "others may write in" in tier.stats().problem and not (shared / "kv-cache").exists()
    assert nowhere.stats().problem and "is not a directory" in on_a_file.stats().problem
    assert len(warnings(caplog)) == 3
    entry = saved("alice")
    for t in (tier, nowhere, on_a_file):
        t.put(entry)
        assert t.load("alice", entry.tokens + [1], False, frozenset()) is None
        t.flush()


def test_a_deleted_directory_is_made_again_at_the_next_write(tmp_path, tiers, caplog):
    import shutil

    tier = tiers(tmp_path)
    written(tier, saved("alice"))
    shutil.rmtree(tmp_path / "kv-cache")
    with caplog.at_level(logging.WARNING):
        written(tier, saved("bob"))
    assert warnings(caplog) == [] and tier.stats().enabled
    assert [p.stem for p in files(tier)] == [saved("bob").key] and tier.stats().entries == 1
    assert loaded(tier, "bob", saved("bob").tokens + [1]) is not None


# --- a restart -------------------------------------------------------------------------------


def test_a_restart_finds_what_was_written_and_close_writes_what_is_queued(tmp_path, tiers):
    tier = tiers(tmp_path)
    entries = [saved(f"user{i}", start=i * 1000) for i in range(5)]
    for entry in entries:
        tier.put(entry)
    tier.close()  # at once: what is queued is written first
    again = tiers(tmp_path)
    assert again.stats().entries == 5
    back = loaded(again, "user3", entries[3].tokens + [1])
    assert back.data == entries[3].data and back.owner == "user3"


# --- budgets and opening ---------------------------------------------------------------------


def test_cache_budgets_explicit_off_and_auto(tmp_path, monkeypatch):
    cfg = ModelConfig(path="m.gguf", host_cache_mib=100, disk_cache_mib=200)
    assert cache_budgets(cfg, tmp_path) == (100 * MIB, 200 * MIB)
    off = ModelConfig(path="m.gguf", host_cache_mib=0, disk_cache_mib=0)
    assert cache_budgets(off, tmp_path) == (0, 0)
    ram = {"free": 8 << 30}
    monkeypatch.setattr(
        footprint, "host_available", lambda: footprint.Available("RAM", ram["free"], 0)
    )
    monkeypatch.setattr(prefix_disk.shutil, "disk_usage", lambda p: _Usage(free=10 << 30))
    auto = ModelConfig(path="m.gguf")
    assert cache_budgets(auto, tmp_path / "not" / "made") == (1 << 30, 1 << 30)  # 1/8, 1/10
    ram["free"] = 64 << 30
    monkeypatch.setattr(prefix_disk.shutil, "disk_usage", lambda p: _Usage(free=1 << 40))
    assert cache_budgets(auto, tmp_path) == (2048 * MIB, 4096 * MIB)  # at most 2 and 4 GiB
    embedding = ModelConfig(path="m.gguf", kind="embedding")
    assert cache_budgets(embedding, tmp_path) == (0, 0)


class _Usage:
    def __init__(self, free: int) -> None:
        self.free = free


@pytest.mark.parametrize("key", ["host_cache_mib", "disk_cache_mib"])
@pytest.mark.parametrize("value", ["-2", str((1 << 20) + 1)])
def test_a_budget_out_of_range_names_its_key(key, value):
    with pytest.raises(ConfigError, match=key):
        parse_config(f'[models.x]\npath = "m.gguf"\n{key} = {value}\n')


def test_open_prefix_tiers_opens_one_per_model_file_and_settings(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(100))
    server = ServerConfig(state_dir=str(tmp_path / "state"))
    model = ModelConfig(path=str(gguf), host_cache_mib=64, disk_cache_mib=128)
    config = Config(default="m", models={"m": model}, server=server)
    host, disk = open_prefix_tiers(config, "m", FakeRunner())
    try:
        assert host == 64 * MIB and disk.budget_bytes == 128 * MIB and disk.enabled
        assert disk.dir.parent == model_dir(tmp_path / "state", "m")
    finally:
        disk.close()
    no_caching = SchedulerConfig(prefix_caching=False)
    assert open_prefix_tiers(replace(config, scheduler=no_caching), "m", FakeRunner()) == (0, None)
    no_disk = replace(config, models={"m": replace(model, disk_cache_mib=0)})
    assert open_prefix_tiers(no_disk, "m", FakeRunner()) == (64 * MIB, None)
    gone = replace(config, models={"m": replace(model, path=str(tmp_path / "gone.gguf"))})
    assert open_prefix_tiers(gone, "m", FakeRunner()) == (64 * MIB, None)  # one warning line
