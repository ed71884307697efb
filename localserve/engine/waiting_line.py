"""The waiting line: who enters the running set next. Written once, for the scheduler and for the
prediction of waits.

The policy (docs/architecture.md, "Scheduling"):
- preempted sequences first, the last preempted at the head: they held cells and are owed them;
- then round-robin across users with waiting work, a user's own requests in arrival order; a
  user at `max_running_per_user` running sequences is passed over until one of theirs ends;
- admission takes the line's head while a slot is free. A head that must wait for cells stops
  admission (nobody behind it passes: a long prompt is never starved by short ones); a head that
  can never fit is refused and the next one looked at. The `static` policy admits only into an
  empty running set.

Whether a head fits is the caller's: the scheduler asks its KV pool (kv.py `try_admit`, which
evicts and matches prefixes), the forecast (waits.py) its count of free cells. Everything else
is here, so a change to the order changes the schedule and the predicted waits together.

Pure Python, no I/O; tested in tests/unit/engine/test_waiting_line.py.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class HasUser(Protocol):
    @property
    def user(self) -> str: ...


T = TypeVar("T", bound=HasUser)
U = TypeVar("U", bound=HasUser)


class Entry(enum.Enum):
    """What the caller's fit check says of the line's head."""

    IN = "in"  # it entered (its cells are committed)
    WAIT = "wait"  # it waits for cells: admission stops here
    REFUSED = "refused"  # it can never fit: out of the line, the next one is looked at


class WaitingLine(Generic[T]):
    """Waiting work (preempted and new) and how many sequences each user runs."""

    def __init__(self, max_running_per_user: int) -> None:
        self.cap = max_running_per_user
        self.requeued: deque[T] = deque()  # preempted: admitted before anyone else
        self.queues: dict[str, deque[T]] = {}  # per user, arrival order
        self.users: deque[str] = deque()  # round-robin order of users with waiting work
        self.num_running: dict[str, int] = {}  # running sequences per user

    def __len__(self) -> int:
        return len(self.requeued) + sum(len(q) for q in self.queues.values())

    def __bool__(self) -> bool:
        return bool(self.requeued or self.queues)

    def add(self, item: T) -> None:
        """A new request, at the end of its user's queue."""
        if item.user not in self.queues:
            self.queues[item.user] = deque()
            self.users.append(item.user)
        self.queues[item.user].append(item)

    def requeue(self, item: T) -> None:
        """A preempted sequence, at the head of the line."""
        self.requeued.appendleft(item)

    def remove(self, item: T) -> None:
        """Out of the line wherever it is (a cancel); nothing if it is not there."""
        if item in self.requeued:
            self.requeued.remove(item)
            return
        queue = self.queues.get(item.user)
        if queue and item in queue:
            queue.remove(item)
            if not queue:
                self._drop_user(item.user)

    def started(self, user: str) -> None:
        self.num_running[user] = self.num_running.get(user, 0) + 1

    def stopped(self, user: str) -> None:
        self.num_running[user] -= 1
        if not self.num_running[user]:
            del self.num_running[user]

    def order(self) -> list[T]:
        """Everything waiting in the order admission would take it (ignoring caps)."""
        order = list(self.requeued)
        queues = [list(self.queues[u]) for u in self.users]
        for i in range(max(map(len, queues), default=0)):
            order += [q[i] for q in queues if i < len(q)]
        return order

    def head(self) -> T | None:
        """The next to enter: preempted first, then round-robin over users under their cap
        (users at their cap are rotated past)."""
        if self.requeued:
            return self.requeued[0]
        for _ in range(len(self.users)):
            user = self.users[0]
            if self.num_running.get(user, 0) < self.cap:
                return self.queues[user][0]
            self.users.rotate(-1)
        return None

    def take(self, item: T) -> None:
        """The head leaves the line (entered or refused); its user's turn is over."""
        if self.requeued and self.requeued[0] is item:
            self.requeued.popleft()
            return
        self.queues[item.user].popleft()
        self.users.rotate(-1)
        if not self.queues[item.user]:
            self._drop_user(item.user)

    def admit(
        self,
        running: list[T],
        max_num_seqs: int,
        static: bool,
        fits: Callable[[T, bool], Entry],
    ) -> tuple[list[T], list[T]]:
        """Let heads into `running` (appended, newest last) while a slot is free. `fits(head,
        anyone_running)` decides cells (with nobody running there is nothing to protect: no
        watermark). Returns those admitted and those refused, in order."""
        admitted: list[T] = []
        refused: list[T] = []
        if static and running:
            return admitted, refused  # a fixed batch runs to the end of its slowest member
        while len(running) < max_num_seqs:
            item = self.head()
            if item is None:
                break
            entry = fits(item, bool(running))
            if entry is Entry.WAIT:
                break
            self.take(item)
            if entry is Entry.REFUSED:
                refused.append(item)
                continue
            running.append(item)
            self.started(item.user)
            admitted.append(item)
        return admitted, refused

    def copy(self, convert: Callable[[T], U]) -> WaitingLine[U]:
        """The same line of `convert`ed items (the forecast's copy to play forward)."""
        line: WaitingLine[U] = WaitingLine(self.cap)
        line.requeued = deque(convert(s) for s in self.requeued)
        line.queues = {u: deque(convert(s) for s in q) for u, q in self.queues.items() if q}
        line.users = deque(u for u in self.users if u in line.queues)
        line.num_running = dict(self.num_running)
        return line

    def _drop_user(self, user: str) -> None:
        del self.queues[user]
        self.users.remove(user)
