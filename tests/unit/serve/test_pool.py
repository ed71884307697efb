"""The pool of models (localserve/serve/pool.py) on fake runners: a model loads on demand, a
failed load says why and is retried at most once per RETRY_LOAD_S, the least recently used
idle model is evicted for a newcomer, a busy one never is (the newcomer waits, saying why), and
a model idle for its keep_alive is unloaded. The real engine: tests/e2e/test_models.py."""

from __future__ import annotations

import asyncio
import re
import threading

import msgspec
import pytest

from localserve.config import (
    Config,
    ConfigError,
    ModelConfig,
    ServerConfig,
    parse_config,
    parse_keep_alive,
)
from localserve.runners.fake import FakeRunner
from localserve.serve.pool import LoadedModel, LoadFailure, ModelPool, UnknownModel, room_for
from tests.support.waiting import async_wait_until


class FakeEngine:
    """What the pool touches of an engine: its event sink and whether it was stopped."""

    def __init__(self) -> None:
        self.on_events = None
        self.problem = ""
        self.stopped = False


def pool_of(names, server: ServerConfig | None = None, fail=(), need_mib=0):
    models = {n: ModelConfig(path=f"/nowhere/{n}.gguf", chat_format="transcript") for n in names}
    config = Config(default=names[0], models=models, server=server or ServerConfig())
    loads = []

    def loader(name: str) -> LoadedModel:
        loads.append(name)
        if name in fail:
            raise RuntimeError(f"{name}.gguf is not a GGUF")
        engine = FakeEngine()
        return LoadedModel(engine, FakeRunner(), lambda: setattr(engine, "stopped", True))

    pool = ModelPool(config, lambda: config.server, loader, lambda events: None)
    for slot in pool.slots.values():
        slot.need_bytes = need_mib << 20
    return pool, loads


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_keep_alive_takes_seconds_durations_and_never():
    assert parse_keep_alive(300) == 300
    assert parse_keep_alive("5m") == 300
    assert parse_keep_alive("1h30m") == 5400
    assert parse_keep_alive("2.5s") == 2.5
    assert parse_keep_alive("-1") == -1 and parse_keep_alive(-5) == -1
    for bad in ("soon", "5 minutes", True):
        with pytest.raises(ValueError, match="keep_alive"):
            parse_keep_alive(bad)
    with pytest.raises(ConfigError, match=r"models.x.keep_alive"):
        parse_config('[models.x]\npath = "x.gguf"\nkeep_alive = "later"')
    assert parse_config("").models["gemma-3-270m"].keep_alive == -1  # the embedded one stays


def test_a_model_loads_when_first_asked_for_and_an_unknown_name_lists_the_models():
    async def main():
        pool, loads = pool_of(["a", "b"])
        with pytest.raises(UnknownModel, match="'a', 'b'"):
            pool.slot("c")
        b = pool.slot("b")
        assert b.state == "unloaded" and pool.slot(None).name == "a"
        await asyncio.gather(pool.ready(b, print), pool.ready(b, print))  # one load for both
        assert b.is_loaded and loads == ["b"] and b.prompts is not None
        assert b.describe()["state"] == "loaded"

    run(main())


def test_a_failed_load_says_why_and_is_retried_at_most_once_per_interval(monkeypatch):
    async def main():
        pool, loads = pool_of(["a", "broken"], fail={"broken"})
        slot = pool.slot("broken")
        with pytest.raises(LoadFailure, match="model broken could not be loaded: broken.gguf is"):
            await pool.ready(slot, print)
        with pytest.raises(LoadFailure, match="not a GGUF") as e:  # at once: no new attempt
            await pool.ready(slot, print)
        assert loads == ["broken"] and e.value.retry_after_s > 0
        assert slot.state == "failed" and "not a GGUF" in slot.reason
        slot.retry_at = 0  # the interval passed
        with pytest.raises(LoadFailure):
            await pool.ready(slot, print)
        assert loads == ["broken", "broken"]

    run(main())


def test_the_least_recently_used_idle_model_makes_room_and_a_busy_one_is_never_evicted():
    async def main():
        pool, loads = pool_of(["a", "b", "c"], ServerConfig(max_loaded_models=2))
        a, b, c = (pool.slot(n) for n in "abc")
        for slot in (a, b):
            await pool.ready(slot, print)
        pool.acquire(b)
        pool.release(b)  # b used after a: a is the least recently used
        await pool.ready(c, print)
        assert (a.state, b.state, c.state) == ("unloaded", "loaded", "loaded")
        assert a.loaded is None
        pool.acquire(b)
        pool.acquire(c)  # both busy: a waits for room
        said = []
        waiting = asyncio.ensure_future(pool.ready(a, said.append))
        await async_wait_until(lambda: said, 30, "a told it waits")  # its need read meanwhile
        assert not waiting.done() and a.state == "loading"
        assert said == ["waiting for memory: b, c are busy"]
        pool.release(c)  # c idle: evicted for a; b, busy, stays
        await waiting
        assert (a.state, b.state, c.state) == ("loaded", "loaded", "unloaded")

    run(main())


def test_a_model_bigger_than_the_whole_budget_fails_its_requests():
    async def main():
        pool, loads = pool_of(["a", "big"], ServerConfig(memory_budget_mib=100), need_mib=150)
        with pytest.raises(LoadFailure, match="needs 150 MiB, more than the whole memory budget"):
            await pool.ready(pool.slot("big"), print)
        assert loads == []

    run(main())


def test_a_budget_that_fits_one_model_swaps_them():
    async def main():
        pool, _ = pool_of(["a", "b"], ServerConfig(memory_budget_mib=100), need_mib=60)
        a, b = pool.slot("a"), pool.slot("b")
        await pool.ready(a, print)
        await pool.ready(b, print)
        assert (a.state, b.state) == ("unloaded", "loaded")

    run(main())


def test_an_idle_model_is_unloaded_after_its_keep_alive_and_a_request_can_shorten_it():
    async def main():
        pool, loads = pool_of(["a", "b"])
        b = pool.slot("b")
        b.model.keep_alive = 0.1
        await pool.ready(b, print)
        engine = b.engine
        pool.acquire(b)
        await asyncio.sleep(0.2)
        assert b.is_loaded  # busy: its keep_alive does not run
        pool.release(b)
        assert b.describe()["expires_at"] > 0
        await async_wait_until(lambda: b.state == "unloaded" and engine.stopped, 30, "unloaded")
        await pool.ready(b, print)  # the next request loads it again
        pool.acquire(b)
        pool.release(b, keep_alive_s=0)  # Ollama's keep_alive 0: unload after this reply
        await async_wait_until(lambda: b.state == "unloaded", 30, "unloaded at once")
        assert loads == ["b", "b"]
        await pool.ready(b, print)
        pool.acquire(b)
        pool.release(b, keep_alive_s=60)  # longer for this request ...
        await asyncio.sleep(0.2)
        assert b.is_loaded and b.keep_alive_s == 60
        pool.acquire(b)
        pool.release(b)  # ... and the model's own again after one without
        assert b.keep_alive_s == 0.1
        a = pool.slot("a")
        a.model.keep_alive = -1  # pinned in models.toml: a request's keep_alive changes nothing
        await pool.ready(a, print)
        pool.acquire(a)
        pool.release(a, keep_alive_s=0)
        await asyncio.sleep(0.05)
        assert a.is_loaded and a.keep_alive_s == -1

    run(main())


def test_server_settings_for_several_models_are_checked():
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"max_loaded_models": -1}, ServerConfig)
    assert ServerConfig().memory_budget_mib == 0 and ServerConfig().max_loaded_models == 0


def test_two_models_loading_at_once_stay_within_max_loaded_models():
    async def main():
        pool, loads = pool_of(["a", "b", "c"], ServerConfig(max_loaded_models=1))
        a, b, c = (pool.slot(n) for n in "abc")
        await pool.ready(a, print)
        pool.acquire(b)
        pool.acquire(c)  # b's and c's requests come together
        said = []
        both = asyncio.gather(pool.ready(b, said.append), pool.ready(c, said.append))
        await async_wait_until(lambda: (b.is_loaded or c.is_loaded) and said, 30, "one loaded")
        assert sum(s.is_loaded for s in (a, b, c)) == 1  # never two loaded at once
        first, second = (b, c) if b.is_loaded else (c, b)
        assert second.state == "loading" and said[-1].endswith(f"{first.name} is busy")
        pool.release(first)  # its reply done: the other evicts it
        await both
        assert (a.state, first.state, second.state) == ("unloaded", "unloaded", "loaded")

    run(main())


def test_a_waiter_that_gives_up_leaves_the_load_going_on_for_the_others():
    async def main():
        pool, loads = pool_of(["a", "b"])
        gate = threading.Event()
        loader = pool._loader
        pool._loader = lambda name: (gate.wait(30), loader(name))[1]
        b = pool.slot("b")
        told = []
        gives_up = asyncio.ensure_future(pool.ready(b, told.append))
        stays = asyncio.ensure_future(pool.ready(b, print))
        await asyncio.sleep(0.05)
        assert b.state == "loading" and len(b._told) == 2
        gives_up.cancel()  # as admission abandons the wait of a cancelled request
        await asyncio.sleep(0)
        assert gives_up.cancelled() and len(b._told) == 1 and b.state == "loading"
        gate.set()
        await stays
        assert b.is_loaded and loads == ["b"] and b._told == [] and b._ready is None

    run(main())


def test_a_busy_model_in_a_loads_way_takes_no_new_request_until_that_load_has_ended():
    """max_loaded_models = 1: a is busy; b's load waits. A new request for a then waits for its
    turn (told why) without holding a, so a drains, is evicted, b loads; then a's request has
    its turn: a loads again once b is idle."""

    async def main():
        pool, loads = pool_of(["a", "b"], ServerConfig(max_loaded_models=1))
        a, b = pool.slot("a"), pool.slot("b")
        await pool.ready(a, print)
        pool.acquire(a)  # a's running request
        pool.acquire(b)
        b_ready = asyncio.ensure_future(pool.ready(b, print, held=True))
        await async_wait_until(lambda: a.yielding_to == "b", 30, "a yields to b")
        assert a.describe()["yielding_to"] == "b"
        pool.acquire(a)  # a new request for a, after b's
        said = []
        a_again = asyncio.ensure_future(pool.ready(a, said.append, held=True))
        await async_wait_until(lambda: said, 30, "a's request told it waits")
        assert not a_again.done() and said == ["waiting for its turn: model b loads first"]
        assert a.active == 1  # only the running one: the waiting one does not hold a
        pool.release(a)  # a drains: evicted, b loads
        await asyncio.sleep(0)
        assert a.loaded is None and not a_again.done()  # no load of a before b's
        await b_ready
        assert b.state == "loaded" and a.loaded is None and not a.yielding_to
        # a's turn: it loads again, once b (busy) drains
        await async_wait_until(lambda: a.state == "loading" and b.yielding_to == "a", 30)
        assert not a_again.done()
        pool.release(b)
        await a_again
        assert (a.state, b.state, loads) == ("loaded", "unloaded", ["a", "b", "a"])
        assert a.active == 1 and not b.yielding_to

    run(main())


def test_a_model_evicted_for_a_load_is_not_loaded_again_before_that_load():
    """While b loads (slowly) in a's place, a new request for a waits for b's load to end
    instead of loading a back at once (which made them swap back and forth)."""

    async def main():
        pool, loads = pool_of(["a", "b"], ServerConfig(max_loaded_models=1))
        gate, load = threading.Event(), pool._loader
        pool._loader = lambda name: (gate.wait(30) if name == "b" else None, load(name))[1]
        a, b = pool.slot("a"), pool.slot("b")
        await pool.ready(a, print)
        pool.acquire(a)
        pool.acquire(b)
        b_ready = asyncio.ensure_future(pool.ready(b, print, held=True))
        await async_wait_until(lambda: a.yielding_to == "b", 30, "a yields to b")
        pool.release(a)  # a drains and is evicted; b's load starts and waits at the gate
        await async_wait_until(lambda: a.loaded is None and b.state == "loading", 30, "a evicted")
        pool.acquire(a)
        late = asyncio.ensure_future(pool.ready(a, print, held=True))
        await asyncio.sleep(0.05)
        assert a.state == "unloaded" and loads == ["a"]  # not loaded back meanwhile
        gate.set()
        await b_ready
        pool.release(b)
        await late
        assert loads == ["a", "b", "a"] and a.is_loaded

    run(main())


# --- what choosing a model costs (the picker's `models` frame) -------------------------------


def test_room_for_names_the_idle_models_to_unload_least_recently_used_first():
    pool, _ = pool_of(["a", "b", "c", "d"], need_mib=100)
    a, b, c, d = (pool.slot(n) for n in "abcd")
    for slot, used in ((a, 2.0), (b, 1.0), (c, 3.0)):
        slot.state, slot.last_used = "loaded", used
    loaded = [a, b, c]
    assert room_for(d.need_bytes, loaded, 400 << 20, 0) == ([], False)  # it fits
    assert room_for(d.need_bytes, loaded, 300 << 20, 0) == ([b], False)  # memory
    assert room_for(d.need_bytes, loaded, 200 << 20, 0) == ([b, a], False)
    assert room_for(d.need_bytes, loaded, 400 << 20, 2) == ([b, a], False)  # the cap
    a.active = b.active = 1  # busy: never unloaded, they block it
    assert room_for(d.need_bytes, loaded, 200 << 20, 0) == ([c], True)


def test_a_choice_says_what_it_would_unload_and_how_long_its_load_takes():
    async def main():
        server = ServerConfig(max_loaded_models=2, memory_budget_mib=1000)
        pool, loads = pool_of(["a", "b", "c", "big"], server, need_mib=100)
        a, b, c, big = (pool.slot(n) for n in ("a", "b", "c", "big"))
        c.need_bytes, big.need_bytes = 300 << 20, 2000 << 20
        for slot in (a, b):
            await pool.ready(slot, print)
        pool.acquire(b)
        pool.release(b)  # a is the least recently used
        a.load_ms, b.load_ms = 1500.0, 2500.0  # 2 s per 100 MiB
        chosen = await pool.choice(c)
        assert (chosen.swap, chosen.swap_waits, chosen.too_big) == (["a"], False, False)
        assert (chosen.load_s, chosen.load_s_from) == (6.0, "estimate")
        assert (await pool.choice(a)).swap == [] and (await pool.choice(a)).load_s is None
        assert (await pool.choice(big)).too_big and (await pool.choice(big)).swap == []
        pool.acquire(a)
        pool.acquire(b)  # both busy: its load would wait for them
        waits = await pool.choice(c)
        assert (waits.swap, waits.swap_waits) == (["a", "b"], True)
        pool.release(a)
        await pool.ready(c, print)  # a makes room for it
        await pool.unload(c)
        c.load_ms = 3200.0
        again = await pool.choice(c)
        assert (again.load_s, again.load_s_from, again.swap) == (3.2, "last_load", [])  # a is gone
        assert loads == ["a", "b", "c"]

    run(main())


def test_nothing_to_go_by_is_no_load_time():
    async def main():
        pool, _ = pool_of(["a", "b"], ServerConfig(memory_budget_mib=1000), need_mib=100)
        chosen = await pool.choice(pool.slot("b"))
        assert (chosen.swap, chosen.load_s, chosen.load_s_from) == ([], None, "")

    run(main())


def test_each_load_swap_unload_and_failed_load_is_one_log_line_with_its_time(caplog):
    """What `localserve serve` prints (cli/__init__.py shows this logger at INFO)."""
    from localserve.serve.pool import idle_time

    def unloaded(name: str) -> bool:
        return any(r.getMessage().startswith(f"model {name} unloaded") for r in caplog.records)

    async def main():
        pool, _ = pool_of(["a", "b", "c"], ServerConfig(max_loaded_models=1), ["c"], 1234)
        loader = pool._loader

        def slow(name):  # as an engine process starting takes a while
            threading.Event().wait(0.2)
            return loader(name)

        pool._loader = slow
        a, b, c = pool.slot("a"), pool.slot("b"), pool.slot("c")
        await pool.ready(a, print)
        await pool.ready(b, print)  # one at a time: a is swapped out for b
        b.model.keep_alive = 0.1
        pool.acquire(b)
        pool.release(b)
        # b idle for its keep_alive: unloaded
        await async_wait_until(lambda: unloaded("b"), 30, "b unloaded after its keep_alive")
        with pytest.raises(LoadFailure):
            await pool.ready(c, print)

    with caplog.at_level("INFO", logger="localserve.serve.pool"):
        run(main())
    lines = [r.getMessage() for r in caplog.records if r.name == "localserve.serve.pool"]
    events = [line for line in lines if not line.startswith("loading model")]
    # the times as measured: a load of at least 0.2 s (longer on a busy machine), an unload of
    # the fakes' next to nothing
    load, unload = r"(0\.[2-9]|[1-9]\d*\.\d)", r"\d+\.\d"
    patterns = [
        rf"model a loaded in {load} s \(1,234 MiB\)",
        r"swap: unloading a to load b \(max_loaded_models = 1\)",
        rf"model a unloaded for b \({unload} s\)",
        rf"model b loaded in {load} s \(1,234 MiB\)",
        rf"model b unloaded after 0\.1 s idle \({unload} s\)",
        rf"model c could not be loaded after {load} s: c\.gguf is not a GGUF",
    ]
    assert len(events) == len(patterns), lines
    for line, pattern in zip(events, patterns, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)
    assert [idle_time(s) for s in (300, 5400, 30, 2.5, 90)] == [
        "5 min", "1.5 h", "30 s", "2.5 s", "1.5 min",
    ]  # fmt: skip


def test_a_load_nobody_waits_for_any_more_is_given_up_in_one_info_line(caplog):
    """max_loaded_models = 1, a busy: b's load waits for room; its only waiter leaves. The load
    is given up (b unloaded, a kept), said once at INFO: no asyncio ERROR with a traceback
    ("Future exception was never retrieved"), which reads as a crash. The next request for b
    loads it."""
    import gc
    import logging

    async def main():
        pool, loads = pool_of(["a", "b"], ServerConfig(max_loaded_models=1))
        a, b = pool.slot("a"), pool.slot("b")
        await pool.ready(a, print)
        pool.acquire(a)  # busy: b's load waits for it
        waiter = asyncio.ensure_future(pool.ready(b, print))
        await async_wait_until(lambda: b.state == "loading", 30, "b waits for room")
        waiter.cancel()
        pool.release(a)  # room now, but nobody wants b
        await async_wait_until(lambda: b._ready is None, 30, "b's load ended")
        gc.collect()  # an exception nobody retrieved is logged when its future goes
        await asyncio.sleep(0)
        assert (a.state, b.state, loads) == ("loaded", "unloaded", ["a"])
        await pool.ready(b, print)  # the next request loads it
        assert b.is_loaded and loads == ["a", "b"]

    with caplog.at_level(logging.INFO):
        run(main())
    assert [r.levelname for r in caplog.records if r.levelno >= logging.ERROR] == []
    given_up = [r for r in caplog.records if "load given up" in r.getMessage()]
    assert len(given_up) == 1 and given_up[0].levelname == "INFO"


def test_a_person_flipping_models_others_use_waits_past_their_swap_budget():
    """max_loaded_models = 1; bob uses a. ann's loads of b evict a, which bob uses: two such
    swaps a minute, then her load waits until the oldest ages out, told why (bob's model
    stays). Evicting what only she used is free; bob's own swaps back count against him."""
    from localserve.serve import swaps

    clock = [1000.0]

    async def main():
        pool, loads = pool_of(["a", "b"], ServerConfig(max_loaded_models=1))
        pool.swaps._clock = lambda: clock[0]
        a, b = pool.slot("a"), pool.slot("b")

        async def use(slot, person):  # one request of `person`, done at once
            said = []
            pool.acquire(slot, person)
            await pool.ready(slot, said.append, held=True, person=person)
            pool.release(slot)
            return said

        await use(a, "bob")
        for _ in range(2):  # ann's two swaps; bob swaps back each time
            await use(b, "ann")
            await use(a, "bob")
        said = []
        pool.acquire(b, "ann")
        third = asyncio.ensure_future(pool.ready(b, said.append, held=True, person="ann"))
        await async_wait_until(lambda: said, 30, "ann told why")
        assert said == ["waiting: model a is serving others for 60 s more"]
        assert a.is_loaded and not third.done()
        await use(a, "bob")  # bob goes on meanwhile
        clock[0] += swaps.SWAP_WINDOW_S  # her oldest swap ages out
        pool._memory_changed.set()
        await third
        pool.release(b)
        assert b.is_loaded and loads == ["a", "b", "a", "b", "a", "b"]
        clock[0] += swaps.SWAP_WINDOW_S + 1  # nobody else has used either lately
        for _ in range(3):  # alone, a person flips as often as they like
            await use(a, "cy")
            await use(b, "cy")

    run(main())


def test_a_load_waiting_for_its_persons_swaps_holds_nobody_elses_requests_back():
    """ann's swaps are spent while bob's reply runs on a: her load of b waits for the budget,
    and a does not stop taking bob's next requests meanwhile (yielding to a load that waits a
    minute would make bob wait that minute)."""

    async def main():
        pool, loads = pool_of(["a", "b"], ServerConfig(max_loaded_models=1, max_swaps_per_person=1))
        a, b = pool.slot("a"), pool.slot("b")
        pool.acquire(a, "bob")
        await pool.ready(a, print, held=True, person="bob")
        pool.release(a)
        pool.acquire(b, "ann")
        await pool.ready(b, print, held=True, person="ann")  # her one swap
        pool.release(b)
        pool.acquire(a, "bob")
        await pool.ready(a, print, held=True, person="bob")  # bob's way back; a busy now
        said = []
        pool.acquire(b, "ann")
        waits = asyncio.ensure_future(pool.ready(b, said.append, held=True, person="ann"))
        await async_wait_until(lambda: said, 30, "ann told why")
        assert said[-1].startswith("waiting: model a is serving others for")
        assert not a.yielding_to
        pool.acquire(a, "bob")  # bob's next request: a is his, at once
        await asyncio.wait_for(pool.ready(a, print, held=True, person="bob"), 5)
        waits.cancel()

    run(main())
