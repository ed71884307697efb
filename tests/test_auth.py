"""Tokens compared as bytes, and the per-address throttle on failed authentication."""

from __future__ import annotations

from localserve.auth import Access, AuthThrottle


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


def test_an_address_is_refused_unchecked_after_its_failures_per_minute():
    clock = Clock()
    throttle = AuthThrottle(3, window_s=60, clock=clock)
    for _ in range(3):
        assert throttle.retry_after("10.0.0.1") == 0
        throttle.failed("10.0.0.1")
        clock.now += 1
    assert throttle.retry_after("10.0.0.1") == 57  # when the first failure leaves the window
    assert throttle.retry_after("10.0.0.2") == 0  # other addresses are not affected
    clock.now += 57
    assert throttle.retry_after("10.0.0.1") == 0
    assert (throttle.num_failures, throttle.num_throttled) == (3, 1)


def test_the_throttle_remembers_a_bounded_number_of_addresses():
    clock = Clock()
    throttle = AuthThrottle(1, max_keys=100, clock=clock)
    for i in range(1000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(throttle._failures) == 100
    assert throttle.retry_after("10.0.3.231") > 0  # the most recent ones are kept
    assert throttle.retry_after("10.0.0.0") == 0
