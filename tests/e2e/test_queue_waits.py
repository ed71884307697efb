"""Waiting, on the real server with four slots (issue 40):

- a waiting client hears its place and predicted wait, places that count down to its admission
  in order, again when someone ahead cancels, and its `done` says what was predicted; the
  monitor's diagnosis names the user who holds most of the server and nobody on a balanced one.
  These need replies that take real time, not the model: they run on the paced fake runner;
- on the real model: the diagnosis names the TTFT target when competing pastes stretch the
  streams' steps (the prefill's real cost), and names the machine when processes spin on every
  core beside the engine, while the same load without them gets its usual reading (the server's
  own snapshots, diagnosed as the monitor diagnoses them).

The order rules themselves (fairness passing a newcomer, preempted first, cells) are tested on
the fake runner in tests/unit/engine/test_waits.py and test_waiting_line.py."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time

import msgspec
import pytest

from localserve.bench.blocking_ws import WS
from localserve.bench.fake_server import FakeServer
from localserve.serve.serving import serving
from tests.support.live import LiveServer, live_config
from tests.support.waiting import wait_until
from tui.diagnosis import diagnose
from tui.diagnosis.rules import OTHERS_CORES_SHARE

SLOTS = 4
STEP_S = 0.02  # the fake's step: a reply of 40 tokens takes 0.8 s


@pytest.fixture(scope="module")
def four_slots():
    """The real model with four slots (a few long replies fill it), and targets that two
    pastes competing beside two streams cannot both meet: ITL 40 ms, TTFT 0.8 s."""
    config = live_config()
    name = config.default
    model = msgspec.structs.replace(config.models[name], max_num_seqs=SLOTS)
    scheduler = msgspec.structs.replace(config.scheduler, itl_target_ms=40, ttft_target_ms=800)
    config = msgspec.structs.replace(config, models={name: model}, scheduler=scheduler)
    with serving(config, thread=True) as served:
        yield LiveServer(served)


@pytest.fixture(scope="module")
def four_fake_slots():
    """The paced fake runner with four slots: replies take real time, steps cost the same."""
    server = FakeServer(step_s=STEP_S, n_seq_max=SLOTS)
    yield server
    server.close()


def chats(server, users: list[str], max_tokens: int = 400) -> list[WS]:
    """One long reply per entry of `users` (a user may come several times), each on its own
    connection; the caller closes them (which cancels what is left)."""
    opened = []
    for i, user in enumerate(users):
        ws = WS(server.url)
        ws.hello(user)
        ws.chat(f"c{i}", "Tell me a long story about the sea.", max_tokens=max_tokens,
                ignore_eos=True, temperature=0.7)  # fmt: skip
        opened.append(ws)
    return opened


def closed(opened: list[WS], server) -> None:
    for ws in opened:
        ws.close()
    server.wait_idle(60)


def diagnosed_when(server, ready, timeout: float = 60.0):
    """The diagnosis of the server's snapshots once `ready(snapshot)` holds."""
    history = []

    def look() -> bool:
        history.append(server.snapshot())
        return ready(history[-1])

    wait_until(look, timeout=timeout, interval=0.25)
    return diagnose(history[-20:])


def everything(d) -> list[str]:
    return [d.headline, *d.details]


def queued_of(frames: list[dict]) -> list[dict]:
    return [f for f in frames if f["type"] == "queued"]


def test_waiting_clients_hear_their_places_count_down_to_admission_in_order(four_fake_slots):
    server = four_fake_slots
    running = [WS(server.url) for _ in range(SLOTS)]
    for i, ws in enumerate(running):  # four replies that end one after another, 0.8 s apart
        ws.hello(f"r{i}")
        ws.chat(f"c{i}", "Tell me about the sea.", max_tokens=40 + 40 * i, ignore_eos=True)
    wait_until(lambda: server.snapshot().running == SLOTS, timeout=60)
    waiting, sent, acked = [WS(server.url) for _ in range(3)], [], []
    heard: list[list[dict]] = []
    for i, ws in enumerate(waiting):  # in this order: each heard it waits before the next asks
        ws.hello(f"w{i}")
        sent.append(time.monotonic())
        ws.chat(f"w{i}", "Hello!", max_tokens=4, ignore_eos=True)
        heard.append(ws.until(lambda f: f["type"] == "queued", 60))
        acked.append(time.monotonic())
    try:
        for i, ws in enumerate(waiting):
            heard[i] += ws.until_done(f"w{i}", timeout=120)
    finally:
        closed(running + waiting, server)
    queued = []  # the server's queue time of each
    for i, frames in enumerate(heard):
        places = [f["position"] for f in queued_of(frames)]
        assert places == sorted(places, reverse=True) and places[-1] <= i + 1, (i, places)
        assert max(places) >= i + 1, (i, places)  # the ones ahead counted too
        queued.append(frames[-1]["timings"]["queue_ms"] / 1e3)
        assert any(f.get("wait_s") is not None for f in queued_of(frames)), frames
        first_token = next(n for n, f in enumerate(frames) if f["type"] == "token")
        assert all(f["type"] != "queued" for f in frames[first_token:])
        assert frames[-1]["timings"]["predicted_queue_ms"] > 0
    # they entered in order: each arrived between its send and its first queued frame, so
    # w[i+1] entering before w[i] would show as its latest possible entry before w[i]'s earliest
    for i in range(len(waiting) - 1):
        assert acked[i + 1] + queued[i + 1] >= sent[i] + queued[i], (sent, acked, queued)


def test_a_cancel_ahead_moves_the_others_up(four_fake_slots):
    server = four_fake_slots
    running = chats(server, ["a", "b", "c", "d"], max_tokens=3000)
    wait_until(lambda: server.snapshot().running == SLOTS, timeout=60)
    waiting = [WS(server.url) for _ in range(3)]
    for i, ws in enumerate(waiting):  # in this order: each heard it waits before the next asks
        ws.hello(f"x{i}")
        ws.chat(f"x{i}", "Hello!", max_tokens=4, ignore_eos=True)
        ws.until(lambda f: f["type"] == "queued", 60)
    try:
        last = waiting[2]
        last.until(lambda f: f["type"] == "queued" and f.get("wait_s") is not None, 60)
        waiting[1].send({"type": "cancel", "id": "x1"})
        moved = last.until(lambda f: f["type"] == "queued" and f["position"] == 2, 60)
        assert moved[-1]["position"] == 2
    finally:
        closed(running + waiting, server)


def test_one_user_holding_the_slots_is_named_and_a_balanced_server_names_nobody(
    four_fake_slots,
):
    server = four_fake_slots
    opened = chats(server, ["alice"] * 4, max_tokens=3000)  # hers fill the slots, then others
    try:
        wait_until(lambda: server.snapshot().running == SLOTS, timeout=60)
        opened += chats(server, ["bob", "carol"])
        d = diagnosed_when(server, lambda s: s.running == SLOTS and s.waiting == 2)
    finally:
        closed(opened, server)
    assert any("alice holds 4 of 4 slots" in line for line in everything(d)), d
    assert any("2 others wait" in line for line in everything(d)), d

    opened = chats(server, ["ann", "ben", "cleo", "dev", "eve", "finn"], max_tokens=3000)
    try:
        d = diagnosed_when(server, lambda s: s.running == SLOTS and s.waiting == 2)
    finally:
        closed(opened, server)
    assert not any(" holds " in line for line in everything(d)), d


def stretching(s) -> bool:
    """The steps stretched for first tokens, and the streams' gaps over the ITL target."""
    return s.steps.stretched_share >= 0.3 and (s.itl.p90 or 0.0) > s.itl_target_s


@pytest.mark.model
def test_the_ttft_target_is_named_when_competing_pastes_stretch_the_streams_steps(four_slots):
    opened = chats(four_slots, ["ann", "ben"], max_tokens=2000)
    try:
        wait_until(lambda: four_slots.snapshot().running == 2, timeout=60)
        time.sleep(1)  # the streams' own pace first
        words = " ".join(["the sea is wide and deep and full of fish"] * 150)  # ~1,700 tokens
        for user in ("cleo", "dev"):
            ws = WS(four_slots.url)
            ws.hello(user)
            ws.chat(user, f"{words}\n\nSummarize this.", max_tokens=8)
            opened.append(ws)
        d = diagnosed_when(four_slots, stretching, timeout=60)
    finally:
        closed(opened, four_slots)
    if host_busy(four_slots.snapshot()) and names_the_machine(d):
        return  # a machine busy with other work is named first (rules.py: the ITL finding defers)
    assert any("TTFT target stretches the steps" in line for line in everything(d)), d


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def cpu_hog():
    """Processes spinning on every core this machine gives us, two per core."""
    n = len(os.sched_getaffinity(0))
    hogs = [multiprocessing.get_context("spawn").Process(target=_spin) for _ in range(2 * n)]
    for p in hogs:
        p.start()
    try:
        yield
    finally:
        for p in hogs:
            p.kill()
            p.join()


def steady_load(server: LiveServer, seconds: float, hog: bool, until=None):
    """Four streams for `seconds` (or until `until(diagnosis)` holds), the diagnosis of their
    last snapshots while all four ran (900 tokens each: the 4,096 cells hold them all)."""
    opened = chats(server, ["ann", "ben", "cleo", "dev"], max_tokens=900)
    history = []
    try:
        wait_until(lambda: server.snapshot().running == SLOTS, timeout=60)
        with cpu_hog() if hog else contextlib.nullcontext():
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                history.append(server.snapshot())
                seen = len(history) > 10 and history[-1].running == SLOTS
                if until is not None and seen and until(diagnose(history[-20:])):
                    break
                time.sleep(0.5)
    finally:
        closed(opened, server)
    while history and history[-1].running < SLOTS:  # (one may have ended first)
        history.pop()
    assert len(history) > 10, "the streams ended before the load was seen"
    return diagnose(history[-20:]), history[-1]


def names_the_machine(d) -> bool:
    return d.headline.startswith("the machine is the limit")


def host_busy(snap) -> bool:
    """Other processes already keep this machine busy (a shared CI machine, a parallel test)."""
    host = snap.host
    return host is not None and host.others >= OTHERS_CORES_SHARE * max(host.cpus, 1)


@pytest.mark.model
def test_a_cpu_hog_beside_the_server_is_named_not_the_load(four_slots):
    # the same load twice: first as the machine is (it also teaches each step size's best)...
    quiet, snap = steady_load(four_slots, 6.5, hog=False)  # > 10 snapshots, 0.5 s apart
    assert snap.host is not None and snap.host.cpus >= 1
    if not host_busy(snap):  # on a quiet machine the load is the server's own: not named
        assert "machine" not in quiet.headline, quiet
    # ...then with processes spinning on every core beside the engine, watched up to 120 s
    # (the load average rises over a minute, and the steps' median over 32 moves only once half
    # of them ran beside the hog); only snapshots taken beside the hog are diagnosed
    busy, snap = steady_load(four_slots, 120, hog=True, until=names_the_machine)
    assert names_the_machine(busy), (busy, snap.steps, snap.host)
