"""Model swaps, budgeted per person: nobody churns the models everyone shares.

With room for fewer models than people use (`max_loaded_models = 1`, or a small memory
budget), a request for a model not loaded evicts an idle one: a person flipping between two
models once a second made everyone else's next request wait for a load (another user's TTFT
went from 0.2-0.8 s to 7-21 s). A swap that evicts a model which served someone else within
the last SWAP_WINDOW_S counts against the person whose request asked for the load; past
`[server] max_swaps_per_person` of them in that window, their load waits until the oldest ages
out, and they are told why ("waiting: model X is serving others for 12 s more"). Meanwhile the
others find their model loaded. Evicting a model that served only the person asking is free:
one person alone hurts nobody.

Owned by the loop, like the pool (serve/pool.py asks it before each eviction). Tested in
tests/unit/serve/test_pool.py and tests/e2e/test_several_models.py.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

SWAP_WINDOW_S = 60.0  # the swaps counted, and who a model served, over this long
MAX_SERVED = 256  # people remembered per model (the oldest forgotten first)


class SwapBudget:
    """Who each model served lately, and each person's counted swaps."""

    def __init__(self, limit: Callable[[], int], clock: Callable[[], float]) -> None:
        self._limit = limit  # max_swaps_per_person (0: no bound)
        self._clock = clock
        self._served: dict[str, dict[str, float]] = {}  # by model: person -> last request
        self._swaps: dict[str, deque[float]] = {}  # by person: their counted swaps' times

    def served(self, model: str, person: str) -> None:
        """A request of `person` for `model` began."""
        people = self._served.setdefault(model, {})
        people.pop(person, None)  # the newest last: the oldest is first to forget
        people[person] = self._clock()
        if len(people) > MAX_SERVED:
            del people[next(iter(people))]

    def wait_s(self, person: str, evicted: str) -> float:
        """How long `person`'s load must wait before it may evict `evicted` (0: now)."""
        limit = self._limit()
        if not limit or not person or not self._serves_others(evicted, person):
            return 0.0
        swaps = self._recent(person)
        if len(swaps) < limit:
            return 0.0
        return max(0.0, swaps[0] + SWAP_WINDOW_S - self._clock())

    def evicted(self, person: str, evicted: str) -> None:
        """`person`'s load evicted `evicted`: counted when it served someone else."""
        if person and self._serves_others(evicted, person):
            self._recent(person).append(self._clock())
        self._served.pop(evicted, None)  # loaded again, it starts afresh

    def _serves_others(self, model: str, person: str) -> bool:
        since = self._clock() - SWAP_WINDOW_S
        return any(p != person and t >= since for p, t in self._served.get(model, {}).items())

    def _recent(self, person: str) -> deque[float]:
        swaps = self._swaps.setdefault(person, deque())
        while swaps and swaps[0] < self._clock() - SWAP_WINDOW_S:
            swaps.popleft()
        if not swaps and len(self._swaps) > MAX_SERVED:  # bounded: forget the quiet ones
            self._swaps = {p: s for p, s in self._swaps.items() if s or p == person}
        return swaps
