"""Tokens compared as bytes, the throttle on failed authentication (a wrong token tried again,
and many wrong tokens from one place), where users come from (a users file, else
$LOCALSERVE_USERS) and the bind-address rule."""

from __future__ import annotations

import pytest

from localserve.config import ConfigError
from localserve.ops.auth import (
    Access,
    AuthThrottle,
    load_monitor_token,
    load_users,
    monitor_refusal,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_tokens_of_any_characters_are_compared_as_bytes():
    access = Access({"zoë": "grüße-für-zoë"}, monitor_token="mönitor-ß")
    assert access.allows_user("zoë", "grüße-für-zoë")
    assert not access.allows_user("zoë", "grüsse-für-zoë")
    assert not access.allows_user("zoë", "\ud800")  # a lone surrogate is just a wrong token
    assert not access.allows_user("zoë", None) and not access.allows_user("bob", "x")
    assert access.allows_monitor("mönitor-ß") and not access.allows_monitor("monitor-ss")


def test_a_wrong_token_tried_again_is_refused_after_its_failures_per_minute():
    clock = Clock()
    throttle = AuthThrottle(3, window_s=60, clock=clock)
    stale = throttle.credential("10.0.0.1 api key", "stale-key")
    for _ in range(3):
        assert throttle.retry_after(stale) == 0
        throttle.failed("10.0.0.1 api key", stale)
        clock.now += 1
    assert throttle.retry_after(stale) == 57  # when its first failure leaves the window
    assert throttle.turn("10.0.0.1 api key") == 0  # one token again is not guessing
    other = throttle.credential("10.0.0.2 api key", "stale-key")
    assert throttle.retry_after(other) == 0  # other places are not affected
    clock.now += 57
    assert throttle.retry_after(stale) == 0
    assert (throttle.num_failures, throttle.num_throttled) == (3, 1)


def test_many_wrong_tokens_make_each_attempt_wait_its_turn():
    clock = Clock()
    throttle = AuthThrottle(3, window_s=60, clock=clock, max_turn_s=30)
    key = "10.0.0.1 user kate"
    for i in range(3):
        assert throttle.turn(key) == 0
        throttle.failed(key, throttle.credential(key, f"guess-{i}"))
    assert throttle.interval_s == 20  # the cap's own rate: 3 a minute
    assert throttle.turn(key) == 20  # its turn: 20 s after the last failure
    assert throttle.turn(key) == 40  # another waits already: refused, and no turn taken
    clock.now += 20
    assert throttle.turn(key) == 20  # the next turn, 20 s after the previous one
    assert throttle.turn("10.0.0.1 user liz") == 0  # other claims are not affected
    clock.now += 60
    assert throttle.turn(key) == 0  # the failures aged out
    assert AuthThrottle(10).interval_s == 5  # not 6: a hello must be answered within 10 s


def test_only_a_salted_hash_of_a_token_is_kept():
    throttle = AuthThrottle(3)
    entry = throttle.credential("loopback monitor", "monitor-secret")
    throttle.failed("loopback monitor", entry)
    assert "monitor-secret" not in repr(throttle.__dict__)
    assert entry != AuthThrottle(3).credential("loopback monitor", "monitor-secret")
    assert throttle.credential("loopback monitor", None) == throttle.credential(
        "loopback monitor", ""
    )


def test_the_throttle_remembers_a_bounded_number_of_keys_and_tokens():
    clock = Clock()
    throttle = AuthThrottle(1, max_keys=100, clock=clock)
    for i in range(1000):
        key = f"10.0.{i // 256}.{i % 256} api key"
        throttle.failed(key, throttle.credential(key, f"guess-{i}"))
        throttle.turn(key)
    assert len(throttle._failures) == len(throttle._credentials) == len(throttle._turns) == 100
    assert throttle.turn("10.0.3.231 api key") > 0  # the most recent ones are kept
    assert throttle.turn("10.0.0.0 api key") == 0


# --- users: the file, else $LOCALSERVE_USERS ---------------------------------------------------


def test_users_come_from_the_file_before_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSERVE_USERS", "eve:eve-token-1")
    path = tmp_path / "users.toml"
    path.write_text('[users]\nalice = "alice-token"\n"zoë" = "grüße-für-zoë"\n', encoding="utf-8")
    assert load_users(str(path)) == {"alice": "alice-token", "zoë": "grüße-für-zoë"}
    assert load_users() == {"eve": "eve-token-1"}


def test_users_from_the_environment_are_trimmed_pairs(monkeypatch):
    monkeypatch.setenv("LOCALSERVE_USERS", " alice:token:with:colons , bob:bob-token-2,")
    assert load_users() == {"alice": "token:with:colons", "bob": "bob-token-2"}
    monkeypatch.setenv("LOCALSERVE_USERS", "")
    assert load_users() == {}
    monkeypatch.delenv("LOCALSERVE_USERS")
    assert load_users(None) == {}


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("alice", "name:token pairs"),
        ("alice:short", "at least 8 characters"),
        (":no-name-token", "printable characters"),
        ("a" * 65 + ":long-enough", "printable characters"),
    ],
)
def test_bad_users_in_the_environment_are_refused(monkeypatch, value, problem):
    monkeypatch.setenv("LOCALSERVE_USERS", value)
    with pytest.raises(ConfigError, match="LOCALSERVE_USERS") as e:
        load_users()
    assert problem in str(e.value)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (None, "no such users file"),
        ("[users\n", "not valid TOML"),
        ("users = 3\n", "expected a table"),
        ("[users]\nalice = 12345678\n", "expected a table"),
        ('[users]\nalice = "short"\n', "at least 8 characters"),
        ('[users]\n"bad\\tname" = "long-enough"\n', "printable characters"),
    ],
)
def test_bad_users_files_are_refused_with_the_path(tmp_path, text, problem):
    path = tmp_path / "users.toml"
    if text is not None:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=problem) as e:
        load_users(str(path))
    assert str(path) in str(e.value)


# --- the bind rule --------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "localhost"])
def test_loopback_binds_need_no_tokens(host):
    Access({}).check_bind(host, is_open=False)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "example.org"])
def test_a_network_bind_needs_tokens_or_open(host):
    with pytest.raises(ConfigError, match=f"refusing to listen on {host}"):
        Access({}).check_bind(host, is_open=False)
    Access({}).check_bind(host, is_open=True)  # open on purpose
    Access({"alice": "alice-token"}).check_bind(host, is_open=False)


def test_trusted_frontends_are_checked_against_the_users():
    from localserve.ops.auth import check_frontends, is_known_user

    users = {"openwebui": "owui-connection-key", "kate": "kates-token"}
    check_frontends(["openwebui"], users)
    check_frontends([], {})
    with pytest.raises(ConfigError, match=r"^\[server\] trusted_frontends: needs a server with"):
        check_frontends(["openwebui"], {})
    with pytest.raises(ConfigError, match=r"trusted_frontends: 'owui' is not a user of the"):
        check_frontends(["owui"], users)
    with pytest.raises(ConfigError, match=r"the user 'openwebui/bob' would be one of"):
        check_frontends(["openwebui"], users | {"openwebui/bob": "bobs-token"})
    assert is_known_user("kate", users, ["openwebui"])
    assert is_known_user("openwebui/alice", users, ["openwebui"])
    assert not is_known_user("openwebui/alice", users, [])
    assert not is_known_user("openwebui/", users, ["openwebui"])
    assert not is_known_user("mallory", users, ["openwebui"])


def test_stats_are_open_on_a_tokenless_server_and_need_the_token_on_one_with_users():
    assert Access({}).allows_monitor(None) and Access({}).allows_monitor("anything")
    with_users = Access({"kate": "correct-horse"})
    assert not with_users.allows_monitor(None) and not with_users.allows_monitor("correct-horse")
    guarded = Access({"kate": "correct-horse"}, monitor_token="m-secret-1")
    assert guarded.allows_monitor("m-secret-1")
    assert not guarded.allows_monitor(None) and not guarded.allows_monitor("m-secret-2")
    assert not Access({}, monitor_token="m-secret-1").allows_monitor(None)


def test_a_monitor_refusal_says_whether_a_token_was_sent():
    assert monitor_refusal("stats need it", None) == "stats need it: none was sent"
    assert monitor_refusal("stats need it", "") == "stats need it: none was sent"
    assert monitor_refusal("stats need it", "guess") == "stats need it: the one sent is wrong"


def test_the_users_file_may_set_the_monitor_token(tmp_path):
    path = tmp_path / "users.toml"
    path.write_text('[users]\nkate = "correct-horse"\n')
    assert load_monitor_token(str(path)) is None and load_monitor_token(None) is None
    path.write_text('[users]\nkate = "correct-horse"\n[monitor]\ntoken = "m-secret-1"\n')
    assert load_monitor_token(str(path)) == "m-secret-1"
    for bad in ('token = "short"', "token = 12345678", 'tokn = "m-secret-1"'):
        path.write_text(f'[users]\nkate = "correct-horse"\n[monitor]\n{bad}\n')
        with pytest.raises(ConfigError, match=r"`monitor`: expected token"):
            load_monitor_token(str(path))
