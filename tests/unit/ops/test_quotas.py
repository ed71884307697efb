"""Daily quotas (localserve/ops/quotas.py): what requests in flight hold, given back when they
are settled, so requests of one user at once stay within the quota together; refusals saying
what is used and held; a new day's allowance. Counted from the database and through the
server: tests/unit/ops/test_usage.py and tests/e2e/test_usage_record.py."""

from __future__ import annotations

import pytest

from localserve.config import ServerConfig
from localserve.ops.quotas import QuotaExceeded, Quotas, next_midnight
from localserve.protocol.frames import UserUsage

NOON = next_midnight(1_800_000_000).timestamp() + 12 * 3600  # a local noon


def _quotas(now: list[float], **server) -> Quotas:
    config = ServerConfig(daily_tokens=100, daily_tokens_per_user={"bo": 0}, **server)
    return Quotas(config, lambda: now[0], {})


def test_requests_in_flight_hold_their_reply_and_stay_within_the_quota_together():
    quotas = _quotas([NOON])
    first = quotas.hold("ann", 80)
    assert first.tokens == 80  # the reply may use 80 of 100
    second = quotas.hold("ann", 80)
    assert second.tokens == 20  # what the first does not hold
    assert quotas.hold("bo", 80) is None  # no quota for bo: nothing held
    refused = quotas.refusal("ann")
    assert "used up (0 today, up to 100 more held by your requests in flight)" in refused.message


def test_a_prompt_is_held_with_what_is_left_for_its_reply_or_refused_when_nothing_is():
    quotas = _quotas([NOON])
    other = quotas.hold("ann", 30)
    hold = quotas.hold("ann", 50)
    assert quotas.hold_prompt(hold, 15, 50) == 50  # 15 + 50 fit the 70 left
    assert hold.tokens == 65
    tight = quotas.hold("ann", 50)
    assert tight.tokens == 5
    assert quotas.hold_prompt(tight, 2, 5) == 3  # the reply cut to what is left after it
    with pytest.raises(QuotaExceeded) as e:
        quotas.hold_prompt(quotas.hold("bea", 10), 100, 10)
    assert "your prompt of 100 tokens does not fit the 100 tokens left" in e.value.message
    assert e.value.retry_after_s > 0
    quotas.settle(other)
    late = quotas.hold("ann", 30)
    assert late.tokens == 30  # what `other` gave back
    with pytest.raises(QuotaExceeded, match="70 more held by your other requests in flight"):
        quotas.hold_prompt(late, 30, 30)


def test_settling_gives_back_everything_a_request_held_once():
    quotas = _quotas([NOON])
    holds = [quotas.hold("ann", 40), quotas.hold("ann", 40)]
    quotas.hold_prompt(holds[0], 10, 40)
    for hold in holds:
        quotas.settle(hold)
    quotas.settle(holds[0])  # again: nothing more to give back
    assert all(h.tokens == 0 for h in holds)
    assert quotas.refusal("ann") is None and quotas.hold("ann", 200).tokens == 100


def test_counted_tokens_use_the_quota_until_the_next_local_midnight():
    now = [NOON]
    quotas = _quotas(now)
    quotas.count("ann", prompt_tokens=70, cached_tokens=20, completion_tokens=70)
    assert quotas.quota("ann").used_today == 120 and quotas.quota("ann").remaining == 0
    assert "daily quota of 100 tokens is used up (120 today)" in quotas.refusal("ann").message
    assert quotas.today() == [UserUsage("ann", 1, 70, 20, 70, 100)]
    assert quotas.quota("bo") is None
    now[0] = next_midnight(NOON).timestamp() + 1
    assert quotas.refusal("ann") is None and quotas.today() == []
    assert quotas.quota("ann").used_today == 0
