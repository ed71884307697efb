"""The state directory trusted for nothing (localserve/ops/state_dir.py): made private, tightened
when others may write it (said), refused when this user cannot; no link in a store's place; a
file told from one put in its place. Through the stores: tests/unit/ops/test_people.py,
test_monitor_token.py."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from localserve.config import ConfigError
from localserve.ops.people import DATABASE, PeopleStore
from localserve.ops.state_dir import file_identity, no_link, private_dir
from localserve.ops.usage_database import DATABASE as USAGE
from localserve.ops.usage_database import UsageError, connect


def test_a_new_state_directory_is_private(tmp_path):
    state = tmp_path / "a" / "state"
    private_dir(state)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700


def test_a_directory_others_may_write_is_tightened_and_said_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "localserve.ops.state_dir")
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    private_dir(state)
    private_dir(state)
    assert stat.S_IMODE(state.stat().st_mode) == 0o755
    assert [r.getMessage() for r in caplog.records] == [
        f"state directory {state}: others could write it (mode 777), and put their files in "
        "its secrets' places: now 755"
    ]


def test_a_shared_directory_is_refused_not_changed(tmp_path):
    """/tmp (sticky, everyone's): tightening it would break everyone else; refused."""
    state = tmp_path / "shared"
    state.mkdir()
    state.chmod(0o1777)
    with pytest.raises(ConfigError, match=r"others may write the state directory \(mode 1777\)"):
        private_dir(state)
    assert stat.S_IMODE(state.stat().st_mode) == 0o1777


def test_what_is_not_a_directory_is_refused(tmp_path):
    (tmp_path / "state").write_text("")
    with pytest.raises(ConfigError, match="cannot create the state directory"):
        private_dir(tmp_path / "state")


def test_a_link_in_a_stores_place_is_refused_in_one_line(tmp_path):
    elsewhere = tmp_path / "elsewhere.sqlite3"
    elsewhere.write_bytes(b"")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / DATABASE).symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="a link in the place of the store of people"):
        PeopleStore(state / DATABASE)
    (state / USAGE).symlink_to(elsewhere)
    with pytest.raises(UsageError, match="a link in the place of the usage record"):
        connect(state / USAGE)
    no_link(state / "nothing-here", "x")  # no file: nothing to refuse


def test_a_file_is_told_from_one_put_in_its_place(tmp_path):
    path = tmp_path / "f"
    assert file_identity(path) is None
    path.write_text("a")
    first = file_identity(path)
    assert first == file_identity(path)
    os.replace(tmp_path / "f", tmp_path / "g")
    path.write_text("a")
    assert file_identity(path) not in (None, first)
