"""The token check: a user's, an API key's or the monitor's token, checked and throttled.

A token check that fails is an `AuthRefusal` (door.py): failures count per place and claim and
per wrong token; past a cap (`[server] max_auth_failures_per_minute`) the throttle
(ops/auth.py's `AuthThrottle`) slows or refuses wrong tokens, and only slows the right one.
Every front-end checks its tokens here (through its door), and so do /metrics and the stats
subscription.

Tested through the server in tests/e2e/test_auth_throttle.py and
tests/e2e/test_websocket_connection.py.
"""

from __future__ import annotations

import asyncio
import logging

from localserve.ops.auth import AuthThrottle, address_group
from localserve.serve.door import AuthRefusal

log = logging.getLogger("localserve.serve.authentication")

# the throttle's refusals: many wrong tokens for one claim from one place, or one wrong token again
LOCKED = "too many failed attempts from your address;"
REPEATED = "too many failed attempts with this token;"


class Authentication:
    """The server's token checks and the throttle of the failed ones (the event loop's)."""

    def __init__(self, max_failures_per_minute: int) -> None:
        self.throttle = AuthThrottle(max_failures_per_minute)

    async def authenticate(
        self, address: str, claim: str, token: str | None, allowed: bool, refusal: str
    ) -> AuthRefusal | None:
        """None when a token check passed; else why not (its refusal, or the throttle's).

        Failures count per place and claim (a user name, "api key", "monitor"), and per wrong
        token: the same wrong token again is refused at once past the cap (uncounted), and many
        different ones lock the claim from that place, where each new attempt then waits its
        turn before its answer. A token that passed from that place recently skips the turn: a
        wrong client does not lock out a right one that was already in, and guessing stays at
        the cap's rate. (A right token new to that place takes a turn like any other.)
        """
        t = self.throttle
        key = f"{address_group(address)} {claim}"
        credential = t.credential(key, token)
        if allowed and t.is_known_good(credential):
            return None
        if not allowed and t.has_failed(credential):  # nothing new to learn: no turn needed
            if wait := t.retry_after(credential):
                return AuthRefusal(f"{REPEATED} try again in {max(wait, 1):.0f} s", wait)
            return self._failed(address, key, credential, refusal, claim)
        wait = t.turn(key)
        if wait > t.interval_s:  # another attempt from there waits its turn
            return AuthRefusal(f"{LOCKED} try again in {wait:.0f} s", wait)
        if wait > 0:
            await asyncio.sleep(wait)
        if allowed:
            t.passed(credential)
            return None
        refused = self._failed(address, key, credential, refusal, claim)
        if wait > 0:
            return AuthRefusal(f"{LOCKED} try again in {t.interval_s:.0f} s", t.interval_s)
        return refused

    def _failed(
        self, address: str, key: str, credential: str, refusal: str, claim: str
    ) -> AuthRefusal:
        """Count a wrong token (and log it); its own refusal."""
        self.throttle.failed(key, credential)
        log.warning("%s: %s (%s)", address, refusal, claim)
        return AuthRefusal(refusal, 0.0)
