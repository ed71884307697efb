"""ops/users_file.py: a users file edited by `localserve users`, read back by the server."""

from __future__ import annotations

import stat

import pytest

from localserve.config import ConfigError
from localserve.ops.auth import load_users
from localserve.ops.users_file import add_users, list_users, remove_users


def test_a_new_file_holds_the_people_with_long_random_tokens_readable_by_its_owner_only(tmp_path):
    path = tmp_path / "users.toml"
    tokens = add_users(path, ["alice", "bob"])
    assert load_users(str(path)) == tokens
    assert len({*tokens.values()}) == 2 and all(len(t) >= 32 for t in tokens.values())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_adding_keeps_every_other_line_and_goes_into_the_users_table(tmp_path):
    path = tmp_path / "users.toml"
    text = (
        '# the household\n[users]\nalice = "alice-secret-1"  # hers\n\n'
        "[daily_tokens]\nalice = 5000\n"
    )
    path.write_text(text)
    path.chmod(0o640)
    tokens = add_users(path, ["bob", "openwebui/x y"])
    after = path.read_text()
    assert after.startswith('# the household\n[users]\nalice = "alice-secret-1"  # hers\n')
    assert after.endswith("\n\n[daily_tokens]\nalice = 5000\n")
    assert load_users(str(path)) == {"alice": "alice-secret-1", **tokens}
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # an existing file keeps its mode
    assert list_users(path) == ["alice", "bob", "openwebui/x y"]


def test_a_file_without_a_users_table_gets_one_at_its_end(tmp_path):
    path = tmp_path / "users.toml"
    path.write_text("[daily_tokens]\nbob = 10")  # no final newline
    tokens = add_users(path, ["bob"])
    assert load_users(str(path)) == tokens
    assert path.read_text().startswith("[daily_tokens]\nbob = 10\n\n[users]\n")


@pytest.mark.parametrize(
    ("names", "why"),
    [
        (["alice"], "there already"),
        (["bob", "bob"], "twice"),
        ([" bob"], "printable"),
        (["x" * 65], "printable"),
    ],
)
def test_a_name_it_cannot_add_changes_nothing(tmp_path, names, why):
    path = tmp_path / "users.toml"
    path.write_text('[users]\nalice = "alice-secret-1"\n')
    with pytest.raises(ConfigError, match=why):
        add_users(path, names)
    assert path.read_text() == '[users]\nalice = "alice-secret-1"\n'
    assert [p.name for p in tmp_path.iterdir()] == ["users.toml"]  # no temporary file left


def test_an_inline_users_table_is_left_for_a_person_to_edit(tmp_path):
    path = tmp_path / "users.toml"
    path.write_text('users = { alice = "alice-secret-1" }\n')
    with pytest.raises(ConfigError, match="edit it by hand"):
        add_users(path, ["bob"])
    assert path.read_text() == 'users = { alice = "alice-secret-1" }\n'


def test_removing_takes_out_just_those_people(tmp_path):
    path = tmp_path / "users.toml"
    path.write_text(
        '[users]\nalice = "alice-secret-1"\n"bob smith" = "bob-secret-22"\n[x]\nbob = 1\n'
    )
    remove_users(path, ["bob smith"])
    assert path.read_text() == '[users]\nalice = "alice-secret-1"\n[x]\nbob = 1\n'
    with pytest.raises(ConfigError, match="no user 'carol'"):
        remove_users(path, ["carol"])
