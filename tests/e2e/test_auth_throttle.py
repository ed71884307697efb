"""The auth throttle on the real server (real sockets, the fake runner): a wrong client does not
lock out the right one, guessing is still slowed to the cap's rate, and the monitor without its
token backs off instead of retrying into the throttle (issue 27, item 2).

The cap is the default (10), over a 6 s window instead of a minute, so a locked claim's turns
come every 0.6 s rather than every 6 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from localserve.bench.blocking_ws import WS
from localserve.ops.auth import Access
from localserve.protocol.frames import Stats
from tests.support.live import configured

USERS = {"kate": "correct-horse", "liz": "battery-staple"}
CAP = 10
WINDOW_S = 6.0
TURN_S = WINDOW_S / CAP


@contextlib.contextmanager
def throttled(fake):
    access = Access(USERS, monitor_token="m-secret")
    with configured(fake, access=access, max_auth_failures_per_minute=CAP) as server:
        server.admission.authentication.throttle.window_s = WINDOW_S
        yield server


def api(fake, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=fake.http + "/v1", api_key=key, max_retries=0, timeout=30)


def models(fake, key: str, ready: threading.Barrier | None = None) -> tuple[int, float]:
    """The status of GET /v1/models with this key, and how long its answer took (the client
    is made first: only the request is timed; with `ready`, it waits there before asking)."""
    client = api(fake, key)
    if ready is not None:
        ready.wait()
    start = time.monotonic()
    try:
        client.models.list()
        status = 200
    except openai.APIStatusError as e:
        status = e.status_code
    return status, time.monotonic() - start


def unslowed(fake) -> float:
    """How long a request takes here and now that nothing slows (the control: liz's key is
    right, and nobody guesses hers)."""
    return max(models(fake, "battery-staple")[1] for _ in range(3))


def test_twelve_wrong_api_keys_then_the_right_one_succeeds(fake):
    with throttled(fake) as server:
        control = unslowed(fake)
        answers = [models(fake, f"guess-{i}") for i in range(12)]
        assert [status for status, _ in answers] == [401] * CAP + [429] * 2
        assert all(took > TURN_S / 2 for _, took in answers[CAP:])  # each waited its turn
        status, took = models(fake, "correct-horse")
        assert status == 200 and took < 2 * control + 2 * TURN_S  # slowed a turn, not refused
        status, took = models(fake, "guess-12")  # the 13th different wrong key
        assert status == 429 and took > TURN_S / 2
        assert server.admission.authentication.throttle.num_failures == 13


def test_a_locked_claim_answers_one_attempt_at_a_time(fake):
    with throttled(fake) as server:
        for i in range(CAP):
            assert models(fake, f"guess-{i}")[0] == 401
        checked_before = server.admission.authentication.throttle.num_failures
        answers: list[tuple[int, float]] = []
        together = threading.Barrier(3)  # the three arrive within one turn, however busy the box

        def attempt(key: str) -> None:
            answers.append(models(fake, key, ready=together))

        threads = [threading.Thread(target=attempt, args=(k,)) for k in ("ga", "gb", "gc")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(status for status, _ in answers) == [429, 429, 429]
        checked = server.admission.authentication.throttle.num_failures - checked_before
        assert checked < 3  # one was refused unchecked: another attempt was waiting its turn


def test_a_wrong_key_tried_again_does_not_slow_the_right_one(fake):
    with throttled(fake):
        statuses = [models(fake, "stale-key")[0] for _ in range(12)]
        assert statuses == [401] * CAP + [429] * 2  # the same wrong key, refused at once
        with pytest.raises(openai.RateLimitError) as e:
            api(fake, "stale-key").models.list()
        assert "with this token" in e.value.message
        assert int(e.value.response.headers["Retry-After"]) > 0
        control = unslowed(fake)
        status, took = models(fake, "correct-horse")
        assert status == 200 and took < 2 * control + TURN_S / 2  # not even slowed


def test_twelve_wrong_tokens_in_hello_then_the_right_one_is_welcomed(fake):
    with throttled(fake):
        opened: list[WS] = []

        def hello(user: str, token: str) -> dict:
            opened.append(WS(fake.url))  # a fresh socket each time: 3 errors close one
            return opened[-1].hello(user, token)

        replies = [hello("kate", f"guess-{i}") for i in range(12)]
        assert all(r["code"] == "unauthorized" for r in replies)
        assert all("try again in" in r["message"] for r in replies[CAP:])
        assert hello("kate", "correct-horse")["type"] == "welcome"
        assert "try again in" in hello("kate", "guess-12")["message"]  # still slowed
        assert hello("liz", "battery-staple")["type"] == "welcome"  # other users unaffected
        for ws in opened:
            ws.close()


def test_a_monitor_without_its_token_does_not_lock_out_the_one_with_it(fake):
    with throttled(fake):
        replies = []
        for _ in range(12):  # the same missing token, as a monitor retrying would send it
            ws = WS(fake.url)
            ws.send({"type": "subscribe", "interval_ms": 0})
            replies.append(ws.recv())
            ws.close()
        assert all(r["code"] == "unauthorized" for r in replies)
        assert all("with this token" in r["message"] for r in replies[CAP:])
        good = urllib.request.Request(
            fake.http + "/metrics", headers={"Authorization": "Bearer m-secret"}
        )
        assert urllib.request.urlopen(good, timeout=10).status == 200
        monitor = WS(fake.url)
        monitor.send({"type": "subscribe", "interval_ms": 100, "token": "m-secret"})
        assert monitor.recv()["type"] == "stats"
        monitor.close()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(fake.http + "/metrics", timeout=10)
        assert refused.value.code == 429 and int(refused.value.headers["Retry-After"]) > 0


def test_the_monitor_without_its_token_backs_off_and_says_so(fake, monkeypatch):
    """tui/source.py on the real server: a refused monitor token is named, and tried again
    after 5, 10, 20, 40 s (not once a second into the throttle); with it, stats come."""
    from tui import source

    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async def first(monitor_token: str | None, count: int) -> list:
        items = []
        async for item in source.WebSocketSource(fake.url, monitor_token, interval_ms=100):
            items.append(item)
            if len(items) == count:
                return items

    with throttled(fake) as server:
        with monkeypatch.context() as patched:
            patched.setattr(source, "asyncio", type("Asyncio", (), {"sleep": sleep}))
            items = asyncio.run(first(None, 4))
        hint = source.NO_MONITOR_TOKEN_HINT
        assert items == [source.Refused(source.NO_MONITOR_TOKEN, s, hint) for s in (5, 10, 20, 40)]
        assert waits == [5, 10, 20]
        assert server.admission.authentication.throttle.num_failures == 4
        items = asyncio.run(first("m-secret", 2))
        assert items[0] == source.Connected(fake.url) and isinstance(items[1], Stats)
