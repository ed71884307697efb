"""The monitor's diagnosis on the real server, the model really running (issue 40): it names the
user who holds most of the server and nobody on a balanced one, and it names the machine when
another process spins on every core beside the engine while the same load without it gets its
usual reading. The snapshots are the server's own (what the monitor reads), diagnosed as the
monitor diagnoses them."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time

import msgspec
import pytest

from localserve.serve.serving import serving
from tests.support.live import WS, LiveServer, live_config
from tests.support.waiting import wait_until
from tui.diagnosis import diagnose

pytestmark = pytest.mark.model
SLOTS = 4


@pytest.fixture(scope="module")
def four_slots():
    """The real model with four slots: a few long replies fill it."""
    config = live_config()
    name = config.default
    model = msgspec.structs.replace(config.models[name], max_num_seqs=SLOTS)
    with serving(msgspec.structs.replace(config, models={name: model}), thread=True) as served:
        yield LiveServer(served)


def chats(server: LiveServer, users: list[str], max_tokens: int = 400) -> list[WS]:
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


def closed(opened: list[WS], server: LiveServer) -> None:
    for ws in opened:
        ws.close()
    server.wait_idle(60)


def diagnosed_when(server: LiveServer, ready, timeout: float = 60.0):
    """The diagnosis of the server's snapshots once `ready(snapshot)` holds."""
    history = []

    def look() -> bool:
        history.append(server.snapshot())
        return ready(history[-1])

    wait_until(look, timeout=timeout, interval=0.25)
    return diagnose(history[-20:])


def everything(d) -> list[str]:
    return [d.headline, *d.details]


def test_one_user_holding_the_slots_is_named_and_a_balanced_server_names_nobody(four_slots):
    opened = chats(four_slots, ["alice"] * 4 + ["bob", "carol"])
    try:
        d = diagnosed_when(four_slots, lambda s: s.running == SLOTS and s.waiting == 2)
    finally:
        closed(opened, four_slots)
    assert any(line.startswith("alice holds 4 of 4 slots") for line in everything(d)), d
    assert any("2 others wait" in line for line in everything(d)), d

    opened = chats(four_slots, ["ann", "ben", "cleo", "dev", "eve", "finn"])
    try:
        d = diagnosed_when(four_slots, lambda s: s.running == SLOTS and s.waiting == 2)
    finally:
        closed(opened, four_slots)
    assert not any(" holds " in line for line in everything(d)), d


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


def steady_load(server: LiveServer, seconds: float, hog: bool):
    """Four streams for `seconds`, the diagnosis of their last snapshots."""
    opened = chats(server, ["ann", "ben", "cleo", "dev"], max_tokens=2000)
    history = []
    try:
        wait_until(lambda: server.snapshot().running == SLOTS, timeout=60)
        with cpu_hog() if hog else contextlib.nullcontext():
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                history.append(server.snapshot())
                time.sleep(0.5)
    finally:
        closed(opened, server)
    return diagnose(history[-20:]), history[-1]


def test_a_cpu_hog_beside_the_server_is_named_not_the_load(four_slots):
    # the same load twice: first on a quiet machine (it also teaches each step size's best)...
    quiet, snap = steady_load(four_slots, 12, hog=False)
    assert "machine" not in quiet.headline, quiet
    assert snap.host is not None and snap.host.cpus >= 1
    # ...then with a process spinning on every core beside the engine
    busy, snap = steady_load(four_slots, 25, hog=True)
    assert busy.headline.startswith("the machine is the limit"), (busy, snap.steps, snap.host)
