"""The usage record's store (localserve/ops/usage.py): quotas counted from the database, clear
errors for a database that cannot be used, local days, `--since`, and a disk that fills up or
files deleted while serving. Through the server it is e2e/test_usage_record.py."""

from __future__ import annotations

import datetime
import logging
import os
import sqlite3
import time

import pytest

from localserve.config import ConfigError, ServerConfig
from localserve.ops import quotas, usage, usage_database, usage_report
from localserve.ops.usage import Usage
from localserve.ops.usage_database import UsageError
from tests.support.usage import recorded, row, rows_where
from tests.support.waiting import wait_until


def test_today_and_quotas_count_from_the_database(tmp_path):
    config = ServerConfig(
        state_dir=str(tmp_path), daily_tokens=100, daily_tokens_per_user={"bo": 0}
    )
    now = [time.time()]
    store = Usage(config, "fake", clock=lambda: now[0])
    recorded(store, row("ann", completion=5), row("ann", prompt=60, cached=0, completion=20))
    assert store.quotas.quota("ann").used_today == 6 + 5 + 60 + 20 == 91
    assert store.quotas.quota("bo") is None  # 0: no quota for bo
    assert store.quotas.refusal("ann") is None
    recorded(store, row("ann", prompt=9, cached=0, completion=0))
    refused = store.quotas.refusal("ann")
    why, wait = refused.message, refused.retry_after_s
    assert "daily quota of 100 tokens is used up (100 today)" in why and "resets at" in why
    assert 0 < wait <= 25 * 3600
    [ann] = store.quotas.today()
    assert (ann.requests, ann.counted_tokens, ann.daily_tokens) == (3, 100, 100)
    store.close()

    again = Usage(config, "fake", clock=lambda: now[0])  # a restart: the counts come back
    assert again.quotas.quota("ann").remaining == 0 and again.quotas.refusal("ann")
    now[0] = quotas.next_midnight(now[0]).timestamp() + 1  # a new day: a new allowance
    assert again.quotas.quota("ann").remaining == 100 and again.quotas.today() == []
    again.close()


def test_a_corrupt_database_is_a_clear_error(tmp_path):
    (tmp_path / usage_database.DATABASE).write_bytes(b"this is not a database" * 100)
    with pytest.raises(UsageError, match="not a usable SQLite database.*move it aside"):
        Usage(ServerConfig(state_dir=str(tmp_path)), "fake")


def test_a_locked_database_is_a_clear_error(tmp_path, monkeypatch):
    Usage(ServerConfig(state_dir=str(tmp_path)), "fake").close()
    holder = sqlite3.connect(tmp_path / usage_database.DATABASE)
    holder.execute("BEGIN EXCLUSIVE")  # another process, holding it
    monkeypatch.setattr(usage_database, "LOCK_TIMEOUT_S", 0.2)
    try:
        with pytest.raises(UsageError, match="locked by another process"):
            Usage(ServerConfig(state_dir=str(tmp_path)), "fake")
    finally:
        holder.rollback()
        holder.close()


def test_a_newer_schema_is_refused_and_an_empty_file_is_migrated(tmp_path):
    path = tmp_path / usage_database.DATABASE
    sqlite3.connect(path).close()  # empty: version 0
    db = usage_database.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == usage_database.SCHEMA_VERSION
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.execute(f"PRAGMA user_version = {usage_database.SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(UsageError, match="newer localserve"):
        usage_database.connect(path)


def test_days_begin_at_local_midnight_on_summer_time_days(monkeypatch):
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        berlin = datetime.timezone(datetime.timedelta(hours=2))
        spring = datetime.datetime(2026, 3, 29, 4, 0, tzinfo=berlin).timestamp()  # after 2→3
        start = datetime.datetime.fromtimestamp(quotas.local_day_start(spring)).astimezone()
        assert start.isoformat() == "2026-03-29T00:00:00+01:00"
        assert quotas.next_midnight(spring).isoformat() == "2026-03-30T00:00:00+02:00"
        autumn = datetime.datetime(2026, 10, 25, 12, 0, tzinfo=berlin).timestamp()
        start = datetime.datetime.fromtimestamp(quotas.local_day_start(autumn)).astimezone()
        assert start.isoformat() == "2026-10-25T00:00:00+02:00"
        assert quotas.next_midnight(autumn).isoformat() == "2026-10-26T00:00:00+01:00"
        week = datetime.datetime.fromtimestamp(usage_report.parse_since("7d", spring)).astimezone()
        assert week.isoformat() == "2026-03-23T00:00:00+01:00"
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize("text", ["0d", "-1d", "1000000d", "²d", "7x", "", "tomorrow"])
def test_since_refuses_what_it_cannot_read(text):
    with pytest.raises(ConfigError, match="--since"):
        usage_report.parse_since(text, time.time())


def test_since_reads_times_with_an_offset():
    now = time.time()
    assert (
        usage_report.parse_since("2026-11-01T10:00:00Z", now)
        == datetime.datetime(2026, 11, 1, 10, tzinfo=datetime.UTC).timestamp()
    )
    assert usage_report.parse_since("24h", now) == now - 86400


def test_other_files_in_its_place_are_clear_errors(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / usage_database.DATABASE).mkdir()
    with pytest.raises(UsageError, match="not a file"):
        usage_database.connect(tmp_path / "a" / usage_database.DATABASE)
    foreign = sqlite3.connect(tmp_path / "b.sqlite3")
    foreign.execute("CREATE TABLE notes (text)")
    foreign.close()
    with pytest.raises(UsageError, match="some other program's database"):
        usage_database.connect(tmp_path / "b.sqlite3")
    lookalike = sqlite3.connect(tmp_path / "c.sqlite3")
    lookalike.execute("CREATE TABLE requests (x)")
    lookalike.execute("PRAGMA user_version = 1")
    lookalike.close()
    with pytest.raises(UsageError, match="not localserve's"):
        usage_database.connect(tmp_path / "c.sqlite3")


def logged(caplog, level: int, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and text in r.getMessage()]


@pytest.fixture
def quick_retries(monkeypatch):
    """The writer tries a broken record again every 0.2 s (1 s when serving): these tests
    wait for a few tries."""
    monkeypatch.setattr(usage, "RETRY_S", 0.2)


@pytest.mark.usefixtures("quick_retries")
def test_a_full_disk_keeps_the_rows_and_writes_them_once_there_is_room(small_disk, caplog):
    """No `then` runs until its row is committed; the problem is said once; the counts hold
    in memory and, once written, across a restart."""
    caplog.set_level(logging.INFO, "localserve.ops.usage")
    config = ServerConfig(state_dir=str(small_disk.path), daily_tokens=1000)
    store = Usage(config, "fake")
    recorded(store, row("ann", prompt=10, cached=0, completion=5))
    small_disk.fill()
    outcomes: list[bool] = []
    for i in range(5):
        r = row("ann", request_id=f"1:full{i}", client_id=f"full{i}", prompt=20, cached=0)
        store.record(r, outcomes.append)
    wait_until(lambda: store.problem, 30, "the problem said")
    assert "database or disk is full" in store.problem and str(store.path) in store.problem
    time.sleep(2.5 * usage.RETRY_S)  # tried again and again: still no room
    assert outcomes == [] and store.num_unwritten == 5 and not rows_where(store, "full0")
    assert store.quotas.quota("ann").used_today == 15 + 5 * 25  # counted all the same
    assert store.record_refusal("ann") and "cannot be written" in store.record_refusal("ann")
    [broke] = logged(caplog, logging.ERROR, "usage record")  # one line, not one per row
    assert "kept in memory" in broke
    small_disk.free()
    wait_until(lambda: outcomes == [True] * 5, 30, "the rows written once there is room")
    assert store.problem == "" and store.record_refusal("ann") is None
    [fixed] = logged(caplog, logging.WARNING, "written again")
    assert "5 rows kept in memory written" in fixed
    assert rows_where(store, "full4")
    assert store.close() == 0
    again = Usage(config, "fake")  # a restart: the counts come from the database, all of them
    assert again.quotas.quota("ann").used_today == 140
    again.close()


@pytest.mark.usefixtures("quick_retries")
def test_database_files_deleted_while_serving_are_noticed_and_made_anew(
    tmp_path, caplog, monkeypatch
):
    caplog.set_level(logging.INFO, "localserve.ops.usage")
    monkeypatch.setattr(usage, "CHECK_S", 0.05)  # the idle writer's look at the file
    store = Usage(ServerConfig(state_dir=str(tmp_path), daily_tokens=1000), "fake")
    problems: list[str] = []
    broken = store._broken
    monkeypatch.setattr(
        store, "_broken", lambda why, **kw: (problems.append(why), broken(why, **kw))
    )
    recorded(store, row("ann", client_id="before", prompt=10, cached=0, completion=5))
    for path in tmp_path.glob(f"{usage_database.DATABASE}*"):  # rm usage.sqlite3*
        path.unlink()
    wait_until(lambda: (tmp_path / usage_database.DATABASE).exists(), 30, "a new database")
    assert problems == [f"{store.path} was deleted while serving"]
    [said] = logged(caplog, logging.ERROR, "was deleted while serving")
    assert "the rows recorded until now are not in the database" in said
    wait_until(lambda: store.problem == "", 30, "writable again")
    assert store.quotas.quota("ann").used_today == 15  # the counts in memory never go back
    recorded(store, row("ann", client_id="after", prompt=10, cached=0, completion=7))
    assert store.quotas.quota("ann").used_today == 32
    assert rows_where(store, "after") and not rows_where(store, "before")

    # replaced by something that is not a database: refused and said until it is gone
    (tmp_path / "junk").write_bytes(b"not a database " * 300)
    os.replace(tmp_path / "junk", store.path)
    wait_until(lambda: "not a usable SQLite database" in store.problem, 30, "the junk noticed")
    assert logged(caplog, logging.ERROR, "was replaced by another file while serving")
    outcomes: list[bool] = []
    store.record(row("ann", client_id="kept"), outcomes.append)
    time.sleep(2 * usage.RETRY_S)
    assert outcomes == [] and store.record_refusal("ann")
    store.path.unlink()  # the operator moves the junk away: a new database, the kept row in it
    wait_until(lambda: outcomes == [True], 30, "the kept row written")
    assert store.problem == "" and rows_where(store, "kept")
    store.close()


def test_a_close_on_a_full_disk_is_bounded_and_says_what_it_loses(small_disk, caplog, monkeypatch):
    caplog.set_level(logging.INFO, "localserve.ops.usage")
    monkeypatch.setattr(usage, "MAX_UNWRITTEN_ROWS", 3)
    monkeypatch.setattr(usage, "CLOSE_TIMEOUT_S", 1.0)
    store = Usage(ServerConfig(state_dir=str(small_disk.path)), "fake")
    small_disk.fill()
    outcomes: list[bool] = []
    for i in range(5):
        store.record(row(request_id=f"1:r{i}"), outcomes.append)
    wait_until(lambda: outcomes == [False, False], 30, "the two oldest dropped, over the bound")
    assert store.num_unwritten == 3
    start = time.monotonic()
    assert store.close() == 5  # 2 over the bound, 3 at close
    assert time.monotonic() - start < usage.CLOSE_TIMEOUT_S + 10  # bounded, however busy
    assert outcomes == [False] * 5
    assert len(logged(caplog, logging.ERROR, "over 3 rows unwritten")) == 1
    assert logged(caplog, logging.ERROR, "3 rows could not be written and are lost")
