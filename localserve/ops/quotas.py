"""Daily quotas: what each user computed today, and what their requests in flight hold of it.

Quotas count tokens the server computed for a user since local midnight: prompt tokens not
reused from the cache plus tokens generated. The counts live in memory, loaded from the usage
database at start-up (so a quota holds across restarts: ops/usage.py) and advanced with every
row it records (never set back, whatever happens to the file).

Requests in flight hold what they may still use (a `Hold` each), so requests of one user at
once stay within the quota together: a chat holds its reply's max_tokens (cut to what is left)
when it is admitted, its prompt's length and the reply's budget once the prompt is built, and
gives all of it back when it is settled (done, or never queued); its row then counts what it
used. An embedding request holds its input tokens once they are counted. Everything here
runs on the event loop.

Tested in tests/unit/ops/test_quotas.py, and through the server in e2e/test_usage_record.py.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass

from localserve.config import ServerConfig
from localserve.protocol.frames import Quota, UserUsage


def local_day_start(now: float) -> float:
    """Unix time of the local midnight that began the day `now` is in (the offset of that
    midnight, not of `now`: on a summer-time day they differ)."""
    return local_midnight(datetime.date.fromtimestamp(now))


def local_midnight(day: datetime.date) -> float:
    return datetime.datetime.combine(day, datetime.time()).timestamp()  # naive = local


def next_midnight(now: float) -> datetime.datetime:
    """The local midnight that ends the day `now` is in (aware, with its own UTC offset)."""
    tomorrow = datetime.date.fromtimestamp(now) + datetime.timedelta(days=1)
    return datetime.datetime.fromtimestamp(local_midnight(tomorrow)).astimezone()


@dataclass(eq=False)
class Hold:
    """What one request in flight holds of its user's daily quota, until it is settled."""

    user: str
    tokens: int = 0


class QuotaExceeded(Exception):
    """A chat the user's quota leaves no room for: why, and the seconds until it resets."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.message, self.retry_after_s = message, retry_after_s


class Quotas:
    """Today's counts per user, the quotas they are held to, and the holds of requests in
    flight (the event loop's)."""

    def __init__(
        self, config: ServerConfig, clock: Callable[[], float], today: dict[str, UserUsage]
    ) -> None:
        self.config = config
        self.clock = clock
        self._day_start = local_day_start(clock())
        self._today = today  # per user, since _day_start
        self._reserved: dict[str, int] = {}  # per user: what requests in flight may still use

    # --- today's counts ---

    def count(self, user: str, prompt_tokens: int, cached_tokens: int, completion_tokens: int):
        """A finished request's tokens, counted from now on (its row is being recorded)."""
        self._roll_day()
        today = self._today.get(user) or UserUsage(user, 0, 0, 0, 0)
        today.requests += 1
        today.prompt_tokens += prompt_tokens
        today.cached_tokens += cached_tokens
        today.completion_tokens += completion_tokens
        self._today[user] = today

    def _roll_day(self) -> None:
        start = local_day_start(self.clock())
        if start != self._day_start:
            self._day_start, self._today = start, {}

    def _used_today(self, user: str) -> int:
        self._roll_day()
        return self._today[user].counted_tokens if user in self._today else 0

    def today(self) -> list[UserUsage]:
        """Everyone's counts today, most tokens first (with their quotas)."""
        self._roll_day()
        users = [
            UserUsage(
                u.user,
                u.requests,
                u.prompt_tokens,
                u.cached_tokens,
                u.completion_tokens,
                self.daily_tokens(u.user) or None,
            )
            for u in self._today.values()
        ]
        return sorted(users, key=lambda u: (-u.counted_tokens, u.user))

    # --- the quotas ---

    def daily_tokens(self, user: str) -> int:
        """The user's daily quota; 0 = none."""
        c = self.config
        return c.daily_tokens_per_user.get(user, c.daily_tokens)

    def quota(self, user: str) -> Quota | None:
        limit = self.daily_tokens(user)
        if not limit:
            return None
        used = self._used_today(user)
        resets = next_midnight(self.clock())
        return Quota(limit, used, max(0, limit - used), resets.isoformat(timespec="seconds"))

    def refusal(self, user: str) -> QuotaExceeded | None:
        """Why a new chat of the user's is refused when the quota is used up, else None."""
        quota = self.quota(user)
        if quota is None or self._allowance(user):
            return None
        pending = self._reserved.get(user, 0)
        held = f", up to {pending} more held by your requests in flight" if pending else ""
        why = (
            f"your daily quota of {quota.daily_tokens} tokens is used up "
            f"({quota.used_today} today{held})"
        )
        return self._exceeded(quota, why)

    def _exceeded(self, quota: Quota, why: str) -> QuotaExceeded:
        wait = max(1.0, datetime.datetime.fromisoformat(quota.resets_at).timestamp() - self.clock())
        hours, minutes = int(wait // 3600), int(wait % 3600 // 60)
        return QuotaExceeded(
            f"{why}; it resets at {quota.resets_at} (in {hours} h {minutes:02d} min)", wait
        )

    def _allowance(self, user: str) -> int | None:
        """Tokens a new request of the user's may use: the quota left after what was used and
        what the user's requests in flight may still use (prompt and reply); None without one."""
        limit = self.daily_tokens(user)
        if not limit:
            return None
        return max(0, limit - self._used_today(user) - self._reserved.get(user, 0))

    def _left(self, hold: Hold) -> int:
        """What is left of the user's quota for the request of `hold` (below 0 when the user's
        requests have used more than it)."""
        others = self._reserved.get(hold.user, 0) - hold.tokens
        return self.daily_tokens(hold.user) - self._used_today(hold.user) - others

    # --- the holds of requests in flight ---

    def hold(self, user: str, max_tokens: int) -> Hold | None:
        """A new chat's hold: its reply's `max_tokens`, cut to what is left of the quota (the
        hold's tokens are the reply's max_tokens from now on); None without a quota."""
        allowance = self._allowance(user)
        if allowance is None:
            return None
        hold = Hold(user)
        self._add(hold, min(max_tokens, allowance))
        return hold

    def hold_prompt(self, hold: Hold, num_tokens: int, max_tokens: int) -> int:
        """The prompt's tokens count against the quota from now on (all of them: what the cache
        saves is known only at the end, when the row counts it), and the reply may use what is
        left after it: the reply's max_tokens, at most `max_tokens`. QuotaExceeded when the
        prompt leaves nothing to generate with."""
        quota, left = self.quota(hold.user), self._left(hold)
        if quota is not None and num_tokens >= left:
            others = self._reserved.get(hold.user, 0) - hold.tokens
            more = f", {others} more held by your other requests in flight" if others > 0 else ""
            raise self._exceeded(
                quota,
                f"your prompt of {num_tokens} tokens does not fit the {max(0, left)} tokens left "
                f"of your daily quota of {quota.daily_tokens} ({quota.used_today} used today"
                f"{more})",
            )
        reply_tokens = min(max_tokens, left - num_tokens)
        self._add(hold, num_tokens + reply_tokens - max_tokens)
        return reply_tokens

    def hold_inputs(self, hold: Hold, num_tokens: int) -> None:
        """An embedding request's input tokens count against the quota from now on (nothing is
        generated after them); QuotaExceeded when they do not fit what is left of it."""
        quota, left = self.quota(hold.user), self._left(hold)
        if quota is not None and num_tokens > left:
            raise self._exceeded(
                quota,
                f"your {num_tokens} input tokens do not fit the {max(0, left)} tokens left of "
                f"your daily quota of {quota.daily_tokens} ({quota.used_today} used today)",
            )
        self._add(hold, num_tokens - hold.tokens)

    def settle(self, hold: Hold) -> None:
        """The request is over (done, or never queued): what it held is given back (what it
        used is its row's, counted when recorded)."""
        self._add(hold, -hold.tokens)

    def _add(self, hold: Hold, tokens: int) -> None:
        """Hold `tokens` more of the user's quota (negative: give some back)."""
        hold.tokens += tokens
        left = self._reserved.get(hold.user, 0) + tokens
        if left > 0:
            self._reserved[hold.user] = left
        else:
            self._reserved.pop(hold.user, None)
