"""The server's websocket connections together: their cap, and what they share.

`Connections` holds every open connection: it says when max_connections users and monitors are
connected, and when one user holds max_connections_per_user of them (so that user's next hello
is refused, nobody else's), cancels a closed connection's requests, and tells them all at
shutdown. What every
connection would otherwise build for itself is built here once: the welcome frame's terms and
the stats frame, encoded once for every monitor from the latest shared snapshot (the last one
when the engine has not answered within STATS_WAIT_S: the stream never stalls) of the model
each monitor watches (the default's, or the one its subscribe named), and the
conversation store (a server with users keeps people's conversations: ops/conversations.py).

Tested in tests/e2e/test_websocket_connection.py; on a fake Frontdoor in
tests/unit/serve/websocket/.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Protocol

import msgspec

from localserve import __version__
from localserve.ops.conversations import ConversationStore
from localserve.ops.usage import Usage
from localserve.protocol.frames import Limits, ModelChoice, ModelList, ModelStatus, Stats, Welcome
from localserve.protocol.snapshot import ModelInfo, Snapshot
from localserve.serve.door import Frontdoor, Request
from localserve.serve.snapshots import NoModelLoaded, Snapshots
from localserve.serve.transport import ConnectionLimits, PlaceLog

_encoder = msgspec.json.Encoder()
STATS_WAIT_S = 2.0  # a stats frame waits this long for the engine's snapshot, then sends the last


class Member(Protocol):
    """What the registry needs of one connection (websocket/connection.py's `Connection`)."""

    requests: dict[str, Request]
    user: str | None

    @property
    def is_silent(self) -> bool: ...

    def send(self, frame) -> None: ...
    def close(self, code: int, reason: str, flush: bool = False) -> None: ...
    async def flush(self, timeout: float) -> None: ...


class Connections:
    """The open websocket connections, their cap, the welcome and the shared stats frame."""

    def __init__(
        self,
        door: Frontdoor,
        snapshots: Snapshots,
        runner: Callable[[], ModelInfo | None],  # the default model's, None: not loaded
        usage: Callable[[], Usage | None],
        conversations: ConversationStore | None = None,
        snapshots_of: Callable[[str], Snapshots] | None = None,  # a named model's (its slot's)
    ) -> None:
        self._door = door
        self._conversations = conversations
        self._snapshots = snapshots
        self._snapshots_of = snapshots_of or (lambda name: snapshots)
        self._info = runner
        self._usage = usage
        self._members: set[Member] = set()
        self.limits: ConnectionLimits | None = None  # the server's sockets, once it listens
        # per model watched (None: the default's), the latest stats frame, encoded, and what it
        # was built from (snapshot, usage version)
        self._stats_frames: dict[str | None, tuple[Snapshot, tuple, bytes]] = {}

    @property
    def usage(self) -> Usage | None:
        """The quotas and the day's usage the frames show (the server's current record)."""
        return self._usage()

    @property
    def conversations(self) -> ConversationStore | None:
        """Where people's conversations are kept: only on a server with users."""
        return self._conversations if self._door.access.requires_tokens else None

    def others_of(self, member: Member) -> list[Member]:
        """The connections of the same user, but this one."""
        return [m for m in self._members if m.user == member.user and m is not member]

    def __iter__(self) -> Iterator[Member]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def add(self, member: Member) -> None:
        self._members.add(member)

    def drop(self, member: Member) -> None:
        """A closed connection: cancel its requests (their cells are freed at the next step).

        Called when it is closed, and again when its handler ends: cancelling twice is harmless.
        """
        self._members.discard(member)
        for request in member.requests.values():
            self._door.cancel(request)

    @property
    def is_full(self) -> bool:
        """max_connections users and monitors are connected.

        One that has said no hello counts for none: the socket caps bound those, and one
        place's silent sockets must not keep everyone else out (transport.ConnectionLimits).
        """
        return sum(not m.is_silent for m in self._members) >= self._door.config.max_connections

    def is_full_for(self, user: str) -> bool:
        """`user` holds max_connections_per_user connections (monitors not counted).

        One user's sockets must not keep the others out: past this, only that user is refused.
        """
        num_held = sum(m.user == user for m in self._members)
        return num_held >= self._door.config.connections_per_user

    @property
    def place_log(self) -> PlaceLog | None:
        """The server's log of trouble by place (one line per place and kind), once it listens."""
        return self.limits.log if self.limits is not None else None

    def welcome(self, user: str) -> Welcome:
        """The answer to a user's hello: the model, the limits, the user's quota."""
        c = self._door.config
        limits = Limits(
            c.max_frame_bytes,
            c.max_tokens,
            c.max_inflight_per_user,
            c.max_queued_per_user,
            c.max_queued,
        )
        info = self._info()
        usage = self.usage
        quota = usage.quotas.quota(user) if usage is not None else None
        return Welcome(
            self._door.model_name,
            self._door.max_model_len,
            limits,
            __version__,
            backend=info.backend if info is not None else "",
            quota=quota,
            conversations=self.conversations is not None,
            models=self._door.model_names,
        )

    async def models_frame(self) -> ModelList:
        """The answer to `list_models`: every model, the default first, with what choosing it
        costs now."""
        # each model's state and cost (admission's model_choices: their other keys left out)
        choices = [msgspec.convert(m, ModelChoice) for m in await self._door.model_choices()]
        return ModelList(choices, self._door.model_name)

    async def stats_frame(self, model: str | None = None) -> bytes:
        """The encoded stats frame of `model`'s latest snapshot (None: the default model's),
        encoded once for every monitor watching it. `model`: a name the door knows."""
        snap = await self._snapshot(model)
        usage = self.usage
        models = [_status(m) for m in self._door.describe_models()]
        version = (usage.version, usage.problem) if usage is not None else (0, "")
        built = self._stats_frames.get(model)
        if built is not None and built[0] is snap and built[1] == (*version, models):
            return built[2]
        today = usage.quotas.today() if usage is not None else []
        frame = _encoder.encode(Stats(snap, today, usage_problem=version[1], models=models))
        self._stats_frames[model] = (snap, (*version, models), frame)
        return frame

    async def _snapshot(self, model: str | None) -> Snapshot:
        """`model`'s latest snapshot, else its last one; a model never loaded has none: the
        default's then (its frames name the engine they show)."""
        snapshots = self._snapshots if model is None else self._snapshots_of(model)
        try:
            return await snapshots.fetch_within(STATS_WAIT_S)  # else the last one
        except NoModelLoaded:  # unloaded: its last figures, and the models' states
            if snapshots.last is not None:
                return snapshots.last
            if model is None:
                raise
        return await self._snapshot(None)

    # --- shutdown -------------------------------------------------------------------------------

    def tell_all(self, frame) -> None:
        for member in list(self._members):
            member.send(frame)

    async def flush_all(self, timeout: float) -> None:
        """Wait (a little) until every connection has handed what it queued to its socket."""
        await asyncio.gather(*(member.flush(timeout) for member in self._members))

    def close_all(self, code: int, reason: str) -> None:
        for member in list(self._members):
            member.close(code, reason)


def _status(model: dict) -> ModelStatus:
    """A model's state (admission's describe_models) as the stats frame carries it."""
    return ModelStatus(
        model["name"],
        model["state"],
        model["busy"],
        model.get("reason", ""),
        model["since"],
        model["memory_mib"],
        model.get("waiting", 0),
    )
