"""`localserve monitor`'s token (localserve/cli/monitor.py): the file of the state directory
the server would use, sent only to a server on this machine; --monitor-token wins."""

from __future__ import annotations

import pytest

from localserve.cli import build_parser
from localserve.cli.monitor import build_monitor, is_this_machine


def monitor_source(*argv: str):
    return build_monitor(build_parser().parse_args(["monitor", *argv])).source


@pytest.fixture
def kept(tmp_path):
    path = tmp_path / "monitor_token"
    path.write_text("the-kept-token\n")
    path.chmod(0o600)
    return path


def test_only_this_machines_addresses_are_this_machine():
    assert is_this_machine("ws://127.0.0.1:8765") and is_this_machine("ws://localhost:8765")
    assert is_this_machine("ws://[::1]:8765")
    assert not is_this_machine("ws://192.0.2.7:8765")  # TEST-NET-1: never an address here
    assert not is_this_machine("ws://no-such-host.invalid:8765")


def test_the_state_directorys_token_is_sent_to_a_server_on_this_machine(kept, monkeypatch):
    monkeypatch.setenv("LOCALSERVE_STATE_DIR", str(kept.parent))
    source = monitor_source()
    assert source.monitor_token == "the-kept-token"
    assert source.monitor_token_file == str(kept)  # for the refusal's hint
    assert monitor_source("--state-dir", str(kept.parent / "x")).monitor_token is None


def test_the_kept_token_never_goes_to_another_machine(kept):
    source = monitor_source("192.0.2.7:8765", "--state-dir", str(kept.parent))
    assert source.monitor_token is None


def test_monitor_token_wins_over_the_file(kept):
    source = monitor_source("--state-dir", str(kept.parent), "--monitor-token", "typed-token")
    assert source.monitor_token == "typed-token"
