"""The waiting line (localserve.engine.waiting_line): its order, the per-user cap, and admission
stopping at a head that waits for cells; and, on the fake runner, that the scheduler's admissions
and the forecast's predicted places come from it together."""

from __future__ import annotations

from dataclasses import dataclass

from localserve.config import SchedulerConfig
from localserve.engine.events import Admitted, WaitPredicted
from localserve.engine.waiting_line import Entry, WaitingLine


@dataclass(eq=False)
class Item:
    name: str
    user: str


def line_of(*names: str, cap: int = 1) -> tuple[WaitingLine[Item], dict[str, Item]]:
    """A line of items named '<user><n>' added in the order given."""
    line: WaitingLine[Item] = WaitingLine(cap)
    items = {n: Item(n, n.rstrip("0123456789")) for n in names}
    for item in items.values():
        line.add(item)
    return line, items


def admit_all(line: WaitingLine[Item], running: list[Item], slots: int) -> list[str]:
    admitted, _ = line.admit(running, slots, False, lambda item, anyone: Entry.IN)
    return [i.name for i in admitted]


def test_users_take_turns_and_the_preempted_go_first():
    line, _ = line_of("ann1", "ann2", "ann3", "bob1", "cat1", "cat2", cap=8)
    line.requeue(Item("zed9", "zed"))
    expected = ["zed9", "ann1", "bob1", "cat1", "ann2", "cat2", "ann3"]
    assert [i.name for i in line.order()] == expected
    assert len(line) == 7
    assert admit_all(line, [], 8) == expected
    assert not line and len(line) == 0


def test_a_user_at_the_cap_is_passed_over_until_one_of_theirs_ends():
    line, _ = line_of("ann1", "ann2", "bob1", "bob2", cap=1)
    running: list[Item] = []
    assert admit_all(line, running, 8) == ["ann1", "bob1"]  # each at the cap now
    assert line.num_running == {"ann": 1, "bob": 1}
    line.stopped("bob")
    running.pop()
    assert admit_all(line, running, 8) == ["bob2"]  # ann's turn came first, but she is full
    assert line.num_running == {"ann": 1, "bob": 1}


def test_a_head_waiting_for_cells_stops_admission_and_one_that_never_fits_is_refused():
    line, items = line_of("ann1", "bob1", "cat1", "dan1", cap=8)
    verdicts = {"bob1": Entry.REFUSED, "cat1": Entry.WAIT}
    running: list[Item] = []
    admitted, refused = line.admit(
        running, 8, False, lambda item, anyone: verdicts.get(item.name, Entry.IN)
    )
    assert [i.name for i in admitted] == ["ann1"]
    assert [i.name for i in refused] == ["bob1"]
    assert [i.name for i in line.order()] == ["cat1", "dan1"]  # dan never passes cat
    assert running == [items["ann1"]]


def test_slots_and_the_static_policy_bound_admission():
    line, _ = line_of("ann1", "bob1", "cat1", cap=8)
    running: list[Item] = []
    assert admit_all(line, running, 2) == ["ann1", "bob1"]
    running.pop()
    admitted, _ = line.admit(running, 8, True, lambda item, anyone: Entry.IN)
    assert admitted == []  # static: nothing enters beside a running batch
    running.clear()
    admitted, _ = line.admit(running, 8, True, lambda item, anyone: Entry.IN)
    assert [i.name for i in admitted] == ["cat1"]


def test_the_fit_check_hears_whether_anyone_runs():
    line, _ = line_of("ann1", "bob1", cap=8)
    seen = []
    line.admit([], 8, False, lambda item, anyone: seen.append(anyone) or Entry.IN)
    assert seen == [False, True]  # the first head alone: no watermark to keep


def test_a_cancel_leaves_the_line_wherever_it_is():
    line, items = line_of("ann1", "ann2", "bob1", cap=8)
    late = Item("zed1", "zed")
    line.requeue(late)
    line.remove(late)
    line.remove(items["bob1"])
    line.remove(Item("nobody", "x"))  # not there: nothing happens
    assert [i.name for i in line.order()] == ["ann1", "ann2"]
    assert list(line.users) == ["ann"]


def test_a_copy_is_the_same_line_and_independent():
    line, _ = line_of("ann1", "ann2", "bob1", cap=1)
    line.started("ann")
    copy = line.copy(lambda item: Item(item.name.upper(), item.user))
    assert [i.name for i in copy.order()] == ["ANN1", "BOB1", "ANN2"]
    assert admit_all(copy, [], 8) == ["BOB1"]  # ann is at her cap in the copy too
    assert [i.name for i in line.order()] == ["ann1", "bob1", "ann2"]  # untouched


def test_the_scheduler_admits_in_the_order_the_forecast_predicted(make_harness):
    # one slot, a cap of one: ann's three, bob's two and cat's one wait behind x's long reply.
    # The places the forecast announces are the order the scheduler then admits them in: both
    # come from the one waiting line (a change to its order changes both; tried on purpose)
    h = make_harness(SchedulerConfig(max_running_per_user=1), n_seq_max=1)
    for i in range(6):
        h.add(f"warm{i}", 30, max_tokens=20, user=f"w{i % 3}")
    h.run()
    h.events.clear()
    h.add("x", 30, max_tokens=200, user="x")
    h.step()
    for rid in ("ann1", "ann2", "ann3", "bob1", "bob2", "cat1"):
        h.add(rid, 30, max_tokens=20, user=rid.rstrip("0123456789"))
    for _ in range(5):
        h.step()
    places = {}
    for e in h.events:
        if isinstance(e, WaitPredicted):
            places.setdefault(e.request_id, e.position)  # the first prediction of each
    predicted = sorted(places, key=places.get)
    h.run()
    admitted = [e.request_id for e in h.events if isinstance(e, Admitted) and e.request_id != "x"]
    assert predicted == admitted
    assert admitted == ["ann1", "bob1", "cat1", "ann2", "bob2", "ann3"]
