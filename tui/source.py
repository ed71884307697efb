"""Where the monitor's numbers come from: the server's stats stream, or anything that yields.

A source is an async iterable of `Connected`, `Disconnected`, `Stats` and `Snapshot` items. The
websocket source subscribes to `stats` frames and reconnects, with backoff, whenever the server goes
away; it passes each frame on whole, so the monitor gets today's per-user totals
(`Stats.usage_today`) with the snapshot. A source without them (an in-process engine, a test) may
yield bare snapshots.

It watches one model's engine (`model`, None: the default's); `watch` switches a live stream to
another model, and the next connection subscribes to it too.

When the server refuses a token (`unauthorized`: the monitor token in `subscribe`, or the
user's in `hello`) trying again at once cannot help and only feeds the server's throttle: the
source says which token (`Refused`): for the monitor token, whether none was sent or a wrong
one, and how to get the right one (its `hint`: the file the server keeps it in); and it waits
longer each time (5 s, doubling, at most a minute) until stats come.

Tested in tests/unit/tui/test_monitor.py, tests/e2e/test_monitor.py and
tests/e2e/test_auth_throttle.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from localserve.protocol.frames import Error, Stats, Subscribe
from localserve.protocol.snapshot import Snapshot
from localserve.websocket_client import Client, ClientError, ConnectionClosed


@dataclass(frozen=True)
class Connected:
    url: str


@dataclass(frozen=True)
class Disconnected:
    reason: str


@dataclass(frozen=True)
class Refused(Disconnected):
    """The server refused a token: what to fix, when the source tries again, and how to get
    the right one (or "")."""

    retry_s: float
    hint: str = ""


SourceItem = Connected | Disconnected | Stats | Snapshot

NO_MONITOR_TOKEN = "no monitor token was sent, and this server needs one"
WRONG_MONITOR_TOKEN = "the monitor token sent is wrong"
TOKEN_FILE = "monitor_token in the server's state directory"
NO_MONITOR_TOKEN_HINT = (
    f"on the server's machine `localserve monitor` reads {TOKEN_FILE} by itself; from "
    "another, pass --monitor-token with that file's content"
)
LOOKED_IN = " (this monitor looked in {path}: none there)"  # its own state directory's file
WRONG_MONITOR_TOKEN_HINT = (
    f"the right one is {TOKEN_FILE} on the server's machine (or its users file's [monitor] "
    "token): pass it with --monitor-token"
)
USER_TOKEN = "the user name or token is wrong (--name, --token)"
REFUSED_RETRY_S = (5.0, 60.0)  # the first and the longest wait after a refused token


class TokenRefused(Exception):
    """The server answered `unauthorized`: what to fix, or (`wait`: the auth throttle's
    refusal, the token may be right) how long to wait."""

    def __init__(self, message: str, wait: float | None = None, hint: str = "") -> None:
        super().__init__(message)
        self.wait = wait
        self.hint = hint


def _refused(error: ClientError | Error, wrong_token: str, hint: str = "") -> TokenRefused:
    """A throttled attempt says so (the server's words, its wait); else the token is wrong."""
    if error.retry_after_s:
        return TokenRefused(error.message, error.retry_after_s)
    return TokenRefused(wrong_token, hint=hint)


class WebSocketSource:
    """Stats frames from a localserve server; reconnects forever. `monitor_token_file`: where
    this monitor looked for the monitor token (its own state directory's), for the refusal's
    hint; the server's may be elsewhere."""

    def __init__(
        self,
        url: str,
        monitor_token: str | None = None,
        user: str | None = None,
        token: str | None = None,
        interval_ms: int = 500,
        max_retry_s: float = 5.0,
        monitor_token_file: str | None = None,
        model: str | None = None,
    ) -> None:
        self.url = url
        self.model = model  # whose engine the stats show (None: the default model's)
        self._client: Client | None = None  # while subscribed
        self.monitor_token = monitor_token
        self.monitor_token_file = monitor_token_file
        self.user, self.token = user, token
        self.interval_ms = interval_ms
        self.max_retry_s = max_retry_s

    async def __aiter__(self) -> AsyncIterator[SourceItem]:
        retry, refused = 0.25, 0.0
        while True:
            try:
                async for item in self._session():
                    if isinstance(item, Connected):  # stats came: the tokens are right
                        retry, refused = 0.25, 0.0
                    yield item
            except TokenRefused as e:
                first, longest = REFUSED_RETRY_S
                refused = min(refused * 2 or first, longest)
                wait = max(refused, e.wait or 0.0)
                yield Refused(str(e), wait, e.hint)
                await asyncio.sleep(wait)
                continue
            except (OSError, ConnectionClosed, ClientError, TimeoutError) as e:
                yield Disconnected(str(e) or type(e).__name__)
            await asyncio.sleep(retry)
            retry = min(retry * 2, self.max_retry_s)

    async def _session(self) -> AsyncIterator[SourceItem]:
        """One connection: the hello (with a user), the subscription, its frames."""
        try:
            client = await Client.connect(self.url, self.user, self.token)
        except ClientError as e:
            if e.code == "unauthorized":
                raise _refused(e, USER_TOKEN) from None
            raise
        async with client:
            await client.send(Subscribe(self.interval_ms, self.monitor_token, self.model))
            is_new = True
            self._client = client
            try:
                async for item in self._frames(client):
                    if is_new:  # connected once the subscription is taken, not before
                        yield Connected(self.url)
                        is_new = False
                    yield item
            finally:
                self._client = None

    async def watch(self, model: str | None) -> None:
        """Show `model`'s engine from now on (None: the default's): the live stream switches
        (the server's next frame is that model's), and every later connection asks for it."""
        self.model = model
        if self._client is not None:
            with contextlib.suppress(OSError, ConnectionClosed):  # the reconnect asks anew
                await self._client.send(Subscribe(self.interval_ms, self.monitor_token, model))

    async def _frames(self, client: Client) -> AsyncIterator[SourceItem]:
        while True:
            frame = await client.recv()
            if isinstance(frame, Stats):
                yield frame
            elif isinstance(frame, Error) and frame.code == "unauthorized":
                raise _refused(frame, *self._monitor_refusal())
            elif isinstance(frame, Error):
                raise ClientError(frame.code, frame.message)

    def _monitor_refusal(self) -> tuple[str, str]:
        """What was wrong with the monitor token (none sent, or a wrong one), and the hint: the
        server's state directory, which this monitor cannot know (it may be on another
        machine), and where this monitor looked, which it does."""
        if self.monitor_token:
            return WRONG_MONITOR_TOKEN, WRONG_MONITOR_TOKEN_HINT
        looked = self.monitor_token_file
        return NO_MONITOR_TOKEN, NO_MONITOR_TOKEN_HINT + (
            LOOKED_IN.format(path=looked) if looked else ""
        )


class QueueSource:
    """Items pushed by hand (tests, or an in-process engine)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[SourceItem] = asyncio.Queue()
        self.model: str | None = None  # what the monitor last asked to watch

    async def watch(self, model: str | None) -> None:
        self.model = model

    def push(self, item: SourceItem) -> None:
        self.queue.put_nowait(item)

    async def __aiter__(self) -> AsyncIterator[SourceItem]:
        while True:
            yield await self.queue.get()
