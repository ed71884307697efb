"""Waiting on a condition, never a fixed sleep: the timeout is only a safety net."""

from __future__ import annotations

import asyncio
import time


def wait_until(predicate, timeout: float = 30.0, what: str = "", interval: float = 0.01):
    """Poll until `predicate()` is truthy and return its value; fail after `timeout` seconds.

    The timeout is only a safety net: a passing test never waits for it.
    """
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what or predicate}")
        time.sleep(interval)
    return value


async def async_wait_until(predicate, timeout: float = 30.0, what: str = "", pause=None):
    """The same on an event loop: `pause` (e.g. a Textual pilot's `pause`) is awaited between
    checks, else the loop is yielded to for 10 ms."""
    async with asyncio.timeout(timeout):
        while not (value := predicate()):
            await (pause() if pause is not None else asyncio.sleep(0.01))
    assert value, what
    return value
