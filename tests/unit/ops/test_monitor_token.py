"""The monitor token (localserve/ops/monitor_token.py): created in the state directory of a
server with users, readable only by its owner, reused; one others may read is refused; a
configured one wins; a tokenless server has none."""

from __future__ import annotations

import os
import stat

import msgspec
import pytest

from localserve.config import ConfigError, ServerConfig
from localserve.ops.monitor_token import read_token, server_monitor_token, token_file
from tests.support.ci import cannot_run_here

USERS = {"kate": "correct-horse"}


@pytest.fixture
def server(tmp_path) -> ServerConfig:
    return msgspec.structs.replace(ServerConfig(), state_dir=str(tmp_path / "state"))


def test_a_server_with_users_creates_its_token_readable_only_by_its_owner(server):
    token = server_monitor_token(None, USERS, server)
    path = token_file(server)
    assert path.name == "monitor_token" and path.is_file()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700  # the new state directory too
    assert path.read_text().strip() == token and len(token) >= 32
    assert not [p for p in path.parent.iterdir() if p != path]  # nothing left aside


def test_the_token_is_created_whole_under_a_loose_umask(server):
    old = os.umask(0)
    try:
        server_monitor_token(None, USERS, server)
    finally:
        os.umask(old)
    assert stat.S_IMODE(token_file(server).stat().st_mode) == 0o600


def test_later_starts_reuse_the_token(server):
    first = server_monitor_token(None, USERS, server)
    assert server_monitor_token(None, USERS, server) == first
    assert read_token(token_file(server)) == first  # as `localserve monitor` reads it


def test_a_token_others_may_read_is_refused_with_how_to_fix_it(server):
    server_monitor_token(None, USERS, server)
    path = token_file(server)
    path.chmod(0o644)
    with pytest.raises(ConfigError) as e:
        server_monitor_token(None, USERS, server)
    assert str(e.value) == (
        f"{path}: others may read this monitor token (mode 644): `chmod 600 {path}`, or "
        "delete it and restart the server for a new one"
    )
    with pytest.raises(ConfigError, match="others may read"):
        read_token(path)  # the monitor refuses it too
    path.chmod(0o600)
    assert read_token(path)


def test_a_file_without_a_token_is_refused(server):
    path = token_file(server)
    path.parent.mkdir(parents=True)
    path.write_text("\n")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="holds no monitor token"):
        server_monitor_token(None, USERS, server)
    path.unlink()
    path.mkdir()
    with pytest.raises(ConfigError, match="cannot read the monitor token|not a file"):
        read_token(path)


def test_a_configured_token_wins_and_no_file_is_made(server):
    assert server_monitor_token("from-the-flag", USERS, server) == "from-the-flag"
    assert not token_file(server).exists()


def test_a_tokenless_server_has_no_monitor_token(server):
    assert server_monitor_token(None, {}, server) is None  # its stats are open, like its chat
    assert not token_file(server).exists()


def test_no_file_is_no_token_and_a_link_is_never_followed(server, tmp_path):
    """A link in the token's place, dangling or to a token someone planted (private, theirs
    to choose), is refused before the first start reads it."""
    path = token_file(server)
    assert read_token(path) is None
    path.parent.mkdir(parents=True)
    path.symlink_to(path.parent / "gone")
    with pytest.raises(ConfigError, match="a link in the monitor token's place .never followed"):
        server_monitor_token(None, USERS, server)
    planted = tmp_path / "planted"
    planted.write_text("chosen-by-mallory\n")
    planted.chmod(0o600)
    path.unlink()
    path.symlink_to(planted)
    with pytest.raises(ConfigError, match="a link in the monitor token's place"):
        server_monitor_token(None, USERS, server)


def test_a_fifo_in_the_tokens_place_is_refused_at_once(server):
    """A FIFO would hang the start waiting for a writer: opened without waiting, refused."""
    path = token_file(server)
    path.parent.mkdir(parents=True)
    os.mkfifo(path, 0o600)
    with pytest.raises(ConfigError, match="not a file: move it aside"):
        server_monitor_token(None, USERS, server)


def test_a_token_of_another_user_is_refused(server):
    if os.geteuid() != 0:
        cannot_run_here("giving a file to another user needs root")  # CI runs as root
    server_monitor_token(None, USERS, server)
    os.chown(token_file(server), 65534, 65534)
    with pytest.raises(ConfigError, match=r"belongs to another user \(uid 65534\)"):
        server_monitor_token(None, USERS, server)


def test_a_state_directory_others_may_write_is_tightened_first(server, caplog):
    """Others who may write the directory could put their file (or link) in the token's
    place: its group and others' write is taken, said once."""
    state = token_file(server).parent
    state.mkdir(parents=True, mode=0o777)
    state.chmod(0o777)
    server_monitor_token(None, USERS, server)
    assert stat.S_IMODE(state.stat().st_mode) == 0o755
    assert "others could write it (mode 777)" in caplog.text
