"""The monitor on every server (issue 38): a real `localserve serve --users FILE` with no other
flag keeps a monitor token in its state directory; `localserve monitor` on the same machine
(the MonitorApp built as the command builds it, driven by Textual's pilot) shows live stats
with no token typed; one without the credential (another state directory, as if on another
machine) is told in one line how to get it; /metrics takes the file's token as a Bearer."""

from __future__ import annotations

import stat
import urllib.error
import urllib.request

import pytest

from tests.support.cli import kill_serve, localserve, slip_line, start_serve
from tests.support.monitor import monitor_header
from tui.source import NO_MONITOR_TOKEN, WRONG_MONITOR_TOKEN

pytestmark = pytest.mark.model

USERS = '[users]\nkate = "correct-horse"\n'


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The server's state directory, its token file's path and its URL."""
    state = tmp_path_factory.mktemp("server-state")
    users = tmp_path_factory.mktemp("etc") / "users.toml"
    users.write_text(USERS)
    users.chmod(0o600)  # the tokens are secrets: serve refuses a file others may read
    proc, url = start_serve(state, args=("--users", str(users)))
    yield state, state / "monitor_token", url, proc.startup_lines
    kill_serve(proc)


def test_the_server_keeps_its_monitor_token_readable_only_by_its_owner(served):
    state, path, _, startup = served
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = path.read_text().strip()
    said = "".join(startup)
    assert f"the monitor token is in {path}" in said and token not in said  # where, not what


def test_the_monitor_on_the_same_machine_shows_live_stats_with_no_token_typed(served, monkeypatch):
    state, path, url, _ = served
    monkeypatch.setenv("LOCALSERVE_STATE_DIR", str(state))  # as the server resolves it
    header, screen = monitor_header(url)
    assert header.startswith("● live") and "gemma" in header
    assert path.read_text().strip() not in screen  # never shown


def test_a_monitor_without_the_credential_is_told_how_to_get_it(served, tmp_path, monkeypatch):
    _, path, url, _ = served
    elsewhere = tmp_path / "another-machine"
    monkeypatch.setenv("LOCALSERVE_STATE_DIR", str(elsewhere))
    header, _ = monitor_header(url)
    what, how = header.splitlines()
    assert what == f"● {NO_MONITOR_TOKEN}; trying again in 5 s"
    assert how.strip() == (
        "on the server's machine `localserve monitor` reads monitor_token in the server's "
        "state directory by itself; from another, pass --monitor-token with that file's content "
        f"(this monitor looked in {elsewhere}/monitor_token: none there)"
    )  # the server's directory in words: this monitor cannot know it, nor where it runs
    header, _ = monitor_header(url, "--monitor-token", path.read_text().strip())
    assert header.startswith("● live")  # the file's content, passed by hand
    header, _ = monitor_header(url, "--monitor-token", "not-the-token")
    assert header.splitlines()[0] == f"● {WRONG_MONITOR_TOKEN}; trying again in 5 s"


def test_metrics_take_the_files_token_as_a_bearer(served):
    _, path, url, _ = served
    http = url.replace("ws://", "http://") + "/metrics"

    def get(token: str | None) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(http, headers=headers)) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    status, body = get(path.read_text().strip())
    assert status == 200 and "localserve:" in body
    assert get(None) == (401, "/metrics needs the monitor token (Bearer): none was sent\n")
    status, body = get("not-the-token")
    assert (status, body) == (
        401,
        "/metrics needs the monitor token (Bearer): the one sent is wrong\n",
    )


def test_a_token_file_others_may_read_is_refused_in_one_line(tmp_path):
    path = tmp_path / "monitor_token"
    path.write_text("a-token-that-leaked\n")
    path.chmod(0o644)
    ran = localserve("monitor", "--state-dir", str(tmp_path), timeout=30)
    slip_line(ran, str(path), "others may read", f"chmod 600 {path}")


def test_the_users_files_monitor_token_is_the_servers(tmp_path, monkeypatch):
    """Set in the users file, it is the token: no file is kept, the monitor passes it."""
    users = tmp_path / "users.toml"
    users.write_text(USERS + '[monitor]\ntoken = "from-the-users-file"\n')
    users.chmod(0o600)
    state = tmp_path / "state"
    proc, url = start_serve(state, args=("--users", str(users)))
    try:
        assert not (state / "monitor_token").exists()
        assert "the monitor token is in" not in "".join(proc.startup_lines)
        monkeypatch.setenv("LOCALSERVE_STATE_DIR", str(state))
        assert monitor_header(url)[0].startswith(f"● {NO_MONITOR_TOKEN}")
        assert monitor_header(url, "--monitor-token", "from-the-users-file")[0].startswith("● live")
    finally:
        kill_serve(proc)
