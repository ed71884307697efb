"""What a chat is on its way in (localserve/serve/admission.py, through a model's door,
model_door.py, and its waits for its model, model_waits.py): a request cancelled while its
model loads stops at once and frees what it held, one waiting too long is refused saying why,
a user's cap on requests in flight holds across every model's door (request_counts.py; on a
pool of fake runners). The server's limits are tested through the server in
e2e/test_websocket_connection.py.
"""

from __future__ import annotations

import pytest

from localserve.serve.door import Refusal, Submission
from tests.support.waiting import async_wait_until


class _Sink:
    """A sink that keeps what it is told."""

    def __init__(self) -> None:
        self.is_closed = False
        self.queued: list[str] = []
        self.dones = []

    def on_token(self, request, text) -> None:
        raise AssertionError("no token for a request cancelled before the engine")

    def on_queued(self, request, position) -> None:
        self.queued.append(request.loading)

    def on_done(self, request, done) -> None:
        self.dones.append(done)


def _admission_of_fake_models(gate, loads, **server):
    """An Admission over a pool of two fake models, "a" and "b"; b's load waits for `gate`.
    Chats go in through a model's door (model_door.py), as a front-end's do."""
    from localserve.config import Config, ModelConfig, ServerConfig
    from localserve.ops.auth import Access
    from localserve.runners.fake import FakeRunner
    from localserve.serve.admission import Admission
    from localserve.serve.pool import LoadedModel, ModelPool

    class FakeEngine:
        on_events, problem, num_rejected = None, "", 0

        def reject(self) -> None:  # a refusal the engine's metrics count
            self.num_rejected += 1

    models = {n: ModelConfig(path=f"/nowhere/{n}.gguf", chat_format="transcript")
              for n in ("a", "b")}  # fmt: skip
    config = Config(default="a", models=models, server=ServerConfig(**server))

    def loader(name: str) -> LoadedModel:
        gate.wait(30)
        loads.append(name)
        return LoadedModel(FakeEngine(), FakeRunner(), lambda: None)

    pool = ModelPool(config, lambda: config.server, loader, lambda events: None)
    return Admission(pool, lambda: pool._server_config(), lambda: None, Access({})), pool


def _door(admission, model: str):
    from localserve.serve.model_door import ModelDoor

    return ModelDoor(admission, admission.pool.slot(None)).model(model)


def test_a_request_cancelled_while_its_model_loads_stops_at_once_and_frees_everything():
    import asyncio
    import threading

    from localserve.protocol.frames import SamplingFields

    async def main():
        gate, loads = threading.Event(), []
        admission, pool = _admission_of_fake_models(gate, loads)
        slot = pool.slot("b")

        async def never_built(prompts, reply):
            raise AssertionError("no prompt is built for a cancelled request")

        for closed in (False, True):
            sink, cancelled = _Sink(), asyncio.Event()
            submitting = asyncio.ensure_future(_door(admission, "b").submit(Submission(
                sink, "ann", "r", f"1:r{closed}", SamplingFields(), never_built,
                cancelled=cancelled)))  # fmt: skip
            await async_wait_until(lambda s=sink: s.queued, 30, "the request told it waits")
            assert sink.queued == ["loading model b"] and slot.active == 1
            assert admission.describe_models()[1]["waiting"] == 1
            sink.is_closed = closed  # a websocket's cancel, then an HTTP client gone
            cancelled.set()
            request = await asyncio.wait_for(submitting, 10)  # at once: the load still going
            assert slot.state == "loading" and slot.active == 0 and not admission.requests
            assert admission.counts.inflight_per_user == {} and admission.counts.waiting == 0
            if closed:
                assert request is None and sink.dones == []
            else:
                assert [d.finish_reason for d in sink.dones] == ["cancelled"]
                assert request.cancelled.is_set() and not request.is_in_engine
        gate.set()
        await pool.ready(slot, print)
        assert slot.is_loaded and loads == ["b"] and slot.active == 0

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_request_waiting_for_its_model_past_max_model_wait_s_is_refused_saying_why():
    import asyncio
    import threading

    from localserve.protocol.frames import SamplingFields

    async def main():
        gate, loads = threading.Event(), []
        admission, pool = _admission_of_fake_models(gate, loads, max_model_wait_s=0.2)

        async def never_built(prompts, reply):
            raise AssertionError("no prompt is built for a request that was refused")

        with pytest.raises(Refusal) as e:
            await _door(admission, "b").submit(
                Submission(_Sink(), "ann", "r", "1:r", SamplingFields(), never_built)
            )
        assert e.value.code == "unavailable" and e.value.retry_after_s > 0
        assert "model b was not ready within 0.2 s (loading model b)" in e.value.message
        assert pool.slot("b").active == 0 and not admission.requests
        gate.set()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_cancel_while_waiting_for_a_swaps_turn_leaves_no_hold_and_a_load_for_nobody_stops():
    """max_loaded_models = 1. Alice's request waits for a's turn while b loads in a's place;
    her cancel gives back exactly her hold (none left on a: it can unload). Then a load that
    everyone left while it waited for room stops: the busy model takes requests again."""
    import asyncio
    import threading

    from localserve.protocol.frames import SamplingFields

    async def never_built(prompts, reply):
        raise AssertionError("no prompt is built for a cancelled request")

    async def main():
        gate, loads = threading.Event(), []
        gate.set()
        admission, pool = _admission_of_fake_models(gate, loads, max_loaded_models=1)
        a, b = pool.slot("a"), pool.slot("b")
        await pool.ready(a, print)
        pool.acquire(a)  # a's running request
        pool.acquire(b)
        gate.clear()  # b's load, once it starts, waits here
        b_ready = asyncio.ensure_future(pool.ready(b, print, held=True))
        await async_wait_until(lambda: a.yielding_to == "b", 30, "a yields to b")
        sink, cancelled = _Sink(), asyncio.Event()
        chat = Submission(
            sink, "alice", "r", "1:r", SamplingFields(), never_built, cancelled=cancelled
        )
        alice = asyncio.ensure_future(_door(admission, "a").submit(chat))
        await async_wait_until(lambda: sink.queued, 30, "alice told she waits")
        assert sink.queued == ["waiting for its turn: model b loads first"]
        pool.release(a)  # a drains, is evicted; b's load starts, held at the gate
        await async_wait_until(lambda: a.loaded is None and b.state == "loading", 30, "a evicted")
        assert a.active == 0
        cancelled.set()
        await asyncio.wait_for(alice, 10)
        assert a.active == 0 and not admission.requests  # no hold left behind
        gate.set()
        await b_ready
        # now b is busy (b_ready holds it); carol asks for a, then leaves at once
        sink, cancelled = _Sink(), asyncio.Event()
        chat = Submission(
            sink, "carol", "r", "2:r", SamplingFields(), never_built, cancelled=cancelled
        )
        carol = asyncio.ensure_future(_door(admission, "a").submit(chat))
        yields = lambda: b.yielding_to == "a" and a.state == "loading"  # noqa: E731
        await async_wait_until(yields, 30, "b yields to a's load")
        cancelled.set()
        await asyncio.wait_for(carol, 10)
        stopped = lambda: not b.yielding_to and a.state == "unloaded"  # noqa: E731
        await async_wait_until(stopped, 30, "the load for nobody stopped")
        assert b.is_loaded  # no swap for nobody
        assert loads == ["a", "b"]

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_users_cap_on_requests_in_flight_holds_across_every_models_door():
    """max_inflight_per_user = 1: ann's chat to a, still having its prompt built, keeps her
    chat to b out (busy), whichever door it comes through; bob is let in. Once hers is gone
    (cancelled), nothing of it stays counted."""
    import asyncio
    import threading

    from localserve.protocol.frames import SamplingFields

    async def main():
        gate, loads = threading.Event(), []
        gate.set()
        admission, pool = _admission_of_fake_models(gate, loads, max_inflight_per_user=1)
        await pool.ready(pool.slot("a"), print)
        building = asyncio.Event()

        async def slow_prompt(prompts, reply):
            building.set()
            await asyncio.Event().wait()  # never built: the request stays in flight

        async def let_in(prompts, reply):
            raise AssertionError("ann's second chat was let in past her cap")

        first = Submission(_Sink(), "ann", "r1", "1:r1", SamplingFields(), slow_prompt)
        hers = asyncio.ensure_future(_door(admission, "a").submit(first))
        await asyncio.wait_for(building.wait(), 10)
        for model in ("b", "a"):
            again = Submission(_Sink(), "ann", "r2", f"2:r2{model}", SamplingFields(), let_in)
            with pytest.raises(Refusal) as e:
                await _door(admission, model).submit(again)
            assert e.value.code == "busy"
            assert e.value.message == "1 requests of yours are already in flight"
        assert pool.slot("a").engine.num_rejected == 1  # b's is not loaded: no engine to tell
        assert admission.counts.inflight_per_user == {"ann": 1}
        building.clear()
        bobs = Submission(_Sink(), "bob", "r3", "3:r3", SamplingFields(), slow_prompt)
        his = asyncio.ensure_future(_door(admission, "a").submit(bobs))
        await asyncio.wait_for(building.wait(), 10)  # let in: the cap is each user's
        for task in (hers, his):
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert not admission.requests and admission.counts.inflight_per_user == {}
        assert pool.slot("a").active == 0

    asyncio.run(asyncio.wait_for(main(), 60))
