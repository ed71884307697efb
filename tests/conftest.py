"""Shared fixtures: an engine over the deterministic fake runner, driven step by step."""

from __future__ import annotations

import contextlib
import os
import tempfile
import zlib

import msgspec
import pytest

from localserve.config import SchedulerConfig
from localserve.engine.engine import Engine
from localserve.engine.events import Done, Event, Token
from localserve.engine.sampling_params import SamplingParams
from localserve.engine.snapshot import build_snapshot
from localserve.runners.fake import FakeRunner

# Servers started by the tests keep their usage database and access logs here, never in the
# developer's own state directory.
os.environ["LOCALSERVE_STATE_DIR"] = tempfile.mkdtemp(prefix="localserve-tests-")


class Harness:
    """An engine on a FakeRunner with a fake clock; collects events per request."""

    def __init__(self, runner: FakeRunner, config: SchedulerConfig) -> None:
        self.runner = runner
        self.events: list[Event] = []
        self.engine = Engine(runner, config, on_events=self.events.extend, clock=runner.clock)

    def add(self, rid: str, n_prompt: int, max_tokens: int = 8, user: str = "u", **kw) -> None:
        params = SamplingParams(max_tokens=max_tokens, temperature=0, **kw)
        salt = zlib.crc32(rid.encode())  # prompts differ per request: no accidental reuse
        tokens = [10 + (i * 7 + salt) % 900 for i in range(n_prompt)]
        self.engine.add_request(rid, tokens, params, user=user)

    def step(self) -> None:
        self.engine.step()

    def run(self, max_steps: int = 10_000) -> None:
        """Step until no work is left."""
        for _ in range(max_steps):
            self.engine.step()
            if not self.engine.scheduler.has_work:
                return
        raise AssertionError("engine did not drain")

    def done(self, rid: str) -> Done | None:
        return next((e for e in self.events if isinstance(e, Done) and e.request_id == rid), None)

    def text(self, rid: str) -> str:
        return "".join(e.text for e in self.events if isinstance(e, Token) and e.request_id == rid)

    @property
    def kv(self):
        return self.engine.kv

    def assert_drained(self) -> None:
        """Nothing live is left: only cached prefixes hold cells, as the fake cache agrees."""
        kv, runner = self.kv, self.runner
        assert kv.num_used == kv.num_cached and kv.num_committed == kv.num_used
        assert runner.num_cells_in_use == kv.num_used
        assert {p.seq_id for p in kv.prefixes} == {i for i, c in runner.cells.items() if c}
        assert runner.num_samplers == 0


@pytest.fixture
def make_harness():
    def make(config: SchedulerConfig | None = None, **runner_kw) -> Harness:
        return Harness(FakeRunner(**runner_kw), config or SchedulerConfig())

    return make


@pytest.fixture(scope="module")
def fake():
    """localserve's server on the paced FakeRunner (tests/helpers.py), one per test module."""
    from helpers import FakeServer

    server = FakeServer()
    yield server
    server.close()


# --- a real server on loopback, port 0, with the real default model -------------------------


class LiveServer:
    """localserve's Server on its own event loop thread, with the real model."""

    def __init__(self, served) -> None:
        self.runner, self.engine, self.server = served.runner, served.engine, served.server
        self.model, self.config = self.server.model, self.server.config
        self.thread = served.thread
        self.call, self.url, self.http = self.thread.call, self.thread.url, self.thread.http

    def snapshot(self):
        return self.call(self.server.snapshots.fetch())

    def wait_idle(self, timeout: float = 30.0):
        """Wait until nothing runs or waits and only cached prefixes hold cells; return it."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            snap = self.snapshot()
            live_cells = snap.kv_live
            if snap.running == 0 and snap.waiting == 0 and live_cells == 0:
                return snap
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"server not idle: {snap.running} running, {live_cells} live cells"
                )
            time.sleep(0.05)


@contextlib.contextmanager
def configured(live, access=None, **limits):
    """Temporarily change the live server's limits or access rules (with a fresh throttle)."""
    from localserve.ops.auth import AuthThrottle

    server, admission = live.server, live.server.admission
    old = server.config, admission.access, admission.throttle
    server.config = msgspec.structs.replace(server.config, **limits)
    admission.access = access or admission.access
    admission.throttle = AuthThrottle(server.config.max_auth_failures_per_minute)
    try:
        yield server
    finally:
        server.config, admission.access, admission.throttle = old


def live_config():
    """The embedded model, small batches, 2 threads: quick on a laptop's CPU."""
    from localserve.config import Config, ModelConfig, ServerConfig

    model = ModelConfig(
        embedded=True,
        chat_format="transcript",
        chat_template="gemma",
        n_ctx=4096,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        n_threads=2,
    )
    return Config(
        default="gemma-3-270m",
        models={"gemma-3-270m": model},
        scheduler=SchedulerConfig(),
        server=ServerConfig(max_frame_bytes=64 * 1024, shutdown_grace_s=2),
    )


@pytest.fixture(scope="session")
def live():
    from localserve.serve.serving import serving

    with serving(live_config(), thread=True) as served:
        yield LiveServer(served)


class WS:
    """A blocking test client speaking JSON dicts."""

    def __init__(self, url: str) -> None:
        from websockets.sync.client import connect

        self.ws = connect(url, max_size=None, legacy=True)

    def send(self, frame) -> None:
        import json

        self.ws.send(frame if isinstance(frame, str | bytes) else json.dumps(frame))

    def recv(self, timeout: float = 30.0) -> dict:
        import json

        return json.loads(self.ws.recv(timeout))

    def hello(self, user: str, token: str | None = None) -> dict:
        self.send({"type": "hello", "user": user, "token": token})
        return self.recv()

    def chat(self, rid: str, text: str, **kw) -> None:
        frame = {"type": "chat", "id": rid, "messages": [{"role": "user", "content": text}]}
        self.send(frame | {"temperature": 0} | kw)

    def until(self, predicate, timeout: float = 60.0) -> list[dict]:
        """Frames up to and including the first that satisfies the predicate."""
        frames = []
        while True:
            frames.append(self.recv(timeout))
            if predicate(frames[-1]):
                return frames

    def until_done(self, rid: str, timeout: float = 60.0) -> list[dict]:
        return self.until(lambda f: f["type"] == "done" and f["id"] == rid, timeout)

    def close(self) -> None:
        self.ws.close()


@pytest.fixture
def connect(live):
    opened: list[WS] = []

    def make() -> WS:
        opened.append(WS(live.url))
        return opened[-1]

    yield make
    for ws in opened:
        ws.close()


@pytest.fixture
def fake_snapshots():
    """Deterministic snapshots of four people sharing a (fake) model, one per engine step."""
    from localserve.engine.sampling_params import SamplingParams

    runner = FakeRunner(n_ctx=8192, n_seq_max=16, max_num_seqs=8, n_batch=512)
    engine = Engine(runner, clock=runner.clock)

    def params(n: int) -> SamplingParams:
        return SamplingParams(temperature=0, max_tokens=n)

    engine.add_request("1:question", [2] * 30, params(24), "ana", client_id="question")
    engine.add_request("2:explain", [2] * 60, params(400), "ben", client_id="explain")
    snapshots = []
    for step in range(30):
        if step == 5:
            engine.add_request("3:paste", [2] * 3000, params(100), "cleo", client_id="paste")
        if step == 8:
            engine.add_request("4:late", [2] * 40, params(12), "dev", client_id="late")
        if step == 9:
            for k in range(8):
                engine.add_request(
                    f"5:batch{k}", [2] * 20, params(50), "eve", client_id=f"batch{k}"
                )
        if step == 20:  # ana's next turn starts with her first: its cells are reused
            engine.add_request(
                "6:followup", [2] * 30 + [5] * 40, params(40), "ana", client_id="followup"
            )
        engine.step()
        snapshots.append(build_snapshot(engine))
    return snapshots
