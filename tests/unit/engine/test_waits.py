"""The waiting requests' places and predicted waits (localserve.engine.waits), on the fake runner:
its steps cost exactly a linear model the engine's cost model learns, and its replies have fixed
lengths, so a prediction made from the scheduler's state must come true; and the places count
down as others finish, are cancelled, are preempted, or as fairness lets a newcomer pass."""

from __future__ import annotations

from localserve.config import SchedulerConfig
from localserve.engine.events import Admitted, Done, Preempted, WaitPredicted
from localserve.engine.snapshot import build_snapshot
from localserve.engine.waits import ReplyLengths


def announced(h, rid: str) -> list[WaitPredicted]:
    return [e for e in h.events if isinstance(e, WaitPredicted) and e.request_id == rid]


def admitted_order(h) -> list[str]:
    return [e.request_id for e in h.events if isinstance(e, Admitted)]


def warmed(make_harness, config: SchedulerConfig | None = None, **runner_kw):
    """A harness whose engine has learned the step costs and that replies are 20 tokens."""
    h = make_harness(config, **runner_kw)
    for i in range(6):
        h.add(f"warm{i}", 30, max_tokens=20, user=f"w{i % 3}")
    h.run()
    h.events.clear()
    return h


def test_reply_lengths_guess_what_is_left_of_a_reply():
    lengths = ReplyLengths()
    assert lengths.remaining("ann", 0, 1000) == 200  # nothing learned yet: a usual chat reply
    for n in (10, 20, 30, 40):
        lengths.add("bob", n)
    assert lengths.remaining("ann", 0, 1000) == 25  # everyone's: the mean of 10..40
    assert lengths.remaining("ann", 25, 1000) == 10  # those longer than 25: 30 and 40
    assert lengths.remaining("ann", 25, 3) == 3  # never past its max_tokens
    assert lengths.remaining("ann", 50, 1000) == 14  # longer than any seen: a quarter more
    for _ in range(4):
        lengths.add("ann", 100)
    assert lengths.remaining("ann", 0, 1000) == 100  # her own, once there are enough
    assert lengths.remaining("bob", 0, 1000) == 25


def test_a_prediction_from_the_state_comes_true(make_harness):
    # two slots, two replies running, four waiting: each enters when one of 20 tokens ends
    h = warmed(make_harness, n_seq_max=2)
    for rid in ("a", "b", "c", "d", "e", "f"):
        h.add(rid, 30, max_tokens=20, user=rid)
    h.step()
    h.step()
    h.run()
    for rid in ("c", "d", "e", "f"):
        t = h.done(rid).timings
        assert t["queue_ms"] > 100, rid  # each really waited
        error = abs(t["predicted_queue_ms"] - t["queue_ms"]) / t["queue_ms"]
        assert error < 0.1, (rid, t)
    assert "predicted_queue_ms" not in h.done("a").timings  # never waited for a prediction


def test_places_count_down_as_others_finish(make_harness):
    h = warmed(make_harness, n_seq_max=2)
    for rid in ("a", "b", "c", "d", "e"):
        h.add(rid, 30, max_tokens=20, user=rid)
    h.run()
    places = [e.position for e in announced(h, "e")]
    assert places[0] == 3 and places == sorted(places, reverse=True)
    assert places[-1] == 1  # told it was next before it entered
    waits = [e.wait_s for e in announced(h, "e")]
    assert all(w is not None and w > 0 for w in waits)


def test_a_cancel_ahead_moves_a_waiting_request_up(make_harness):
    h = warmed(make_harness, n_seq_max=1)
    for rid in ("a", "b", "c"):
        h.add(rid, 30, max_tokens=60, user=rid)
    for _ in range(3):
        h.step()
    assert [e.position for e in announced(h, "c")] == [2]
    h.engine.cancel("b")
    for _ in range(40):  # well past the next round of predictions (0.5 s of fake clock)
        h.step()
    assert [e.position for e in announced(h, "c")][:2] == [2, 1]


def test_fairness_lets_a_newcomer_pass_and_the_places_say_so(make_harness):
    # ann's three requests wait behind one slot; bob's one comes later but gets the next turn
    h = warmed(make_harness, n_seq_max=1)
    h.add("x", 30, max_tokens=200, user="x")
    h.step()
    for rid in ("ann1", "ann2", "ann3"):
        h.add(rid, 30, max_tokens=20, user="ann")
    for _ in range(30):
        h.step()
    assert announced(h, "ann2")[-1].position == 2
    h.add("bob1", 30, max_tokens=20, user="bob")
    for _ in range(30):
        h.step()
    assert announced(h, "bob1")[-1].position == 2  # after ann1, before ann2 (round-robin)
    assert announced(h, "ann2")[-1].position == 3
    h.run()
    assert admitted_order(h)[-4:] == ["ann1", "bob1", "ann2", "ann3"]


def test_a_preempted_request_is_first_in_line(make_harness):
    # a cache of 200 cells: the three replies outgrow it and the newest is preempted
    config = SchedulerConfig(kv_watermark=0.0)
    h = warmed(make_harness, config, n_ctx=200, n_seq_max=4)
    for rid in ("a", "b", "c"):
        h.add(rid, 40, max_tokens=60, user=rid)
    h.add("d", 40, max_tokens=20, user="d")
    preempted = None
    for _ in range(200):
        h.step()
        preempted = preempted or next((e for e in h.events if isinstance(e, Preempted)), None)
        if preempted and announced(h, preempted.request_id):
            break
    assert preempted is not None
    assert announced(h, preempted.request_id)[-1].position == 1
    h.run()
    assert all(isinstance(h.done(r), Done) for r in "abcd")


def test_waits_for_cells_not_only_for_slots(make_harness):
    # slots to spare, but the long prompt needs the cells two running replies hold
    config = SchedulerConfig(kv_watermark=0.0)
    h = warmed(make_harness, config, n_ctx=400, n_seq_max=4)
    for rid in ("a", "b"):
        h.add(rid, 100, max_tokens=20, user=rid)
    h.step()
    h.add("long", 300, max_tokens=4, user="c")
    for _ in range(30):
        h.step()
    told = announced(h, "long")
    assert told and told[0].position == 1 and told[0].wait_s > 0
    h.run()
    t = h.done("long").timings
    assert abs(t["predicted_queue_ms"] - t["queue_ms"]) / t["queue_ms"] < 0.25, t


def test_the_first_to_end_frees_the_slot(make_harness):
    # a reply capped at 6 tokens ends long before one of 20: the waiting one enters then
    h = warmed(make_harness, n_seq_max=2)
    h.add("short", 30, max_tokens=6, user="a")
    h.add("long", 30, max_tokens=20, user="b")
    h.add("next", 30, max_tokens=20, user="c")
    h.run()
    t = h.done("next").timings
    assert abs(t["predicted_queue_ms"] - t["queue_ms"]) / t["queue_ms"] < 0.1, t


def test_the_error_is_measured_and_a_newcomer_is_told_its_wait(make_harness):
    h = warmed(make_harness, n_seq_max=2)
    assert build_snapshot(h.engine).newcomer_wait_s == 0  # room to spare: in at once
    histogram = h.engine.metrics.histograms["request_queue_time_prediction_error_seconds"]
    before = histogram.count  # (the warm-up's waits)
    for rid in ("a", "b", "c", "d", "e", "f"):
        h.add(rid, 30, max_tokens=20, user=rid)
    h.step()
    h.step()
    snap = build_snapshot(h.engine)
    waits = [row.predicted_wait_s for row in snap.waiting_seqs]
    assert len(waits) == 4 and all(w is not None and w > 0 for w in waits)
    assert snap.newcomer_wait_s > max(waits)  # a new user's turn comes after theirs
    h.run()
    assert histogram.count == before + 4  # each that waited
    assert h.engine.metrics.latency()["queue_error"].count == before + 4
