"""Shared fixtures: an engine over the deterministic fake runner, driven step by step."""

from __future__ import annotations

import pytest

from localserve.config import SchedulerConfig
from localserve.engine import Done, Engine, Event, Token
from localserve.fake_runner import FakeRunner
from localserve.sequence import SamplingParams


class Harness:
    """An engine on a FakeRunner with a fake clock; collects events per request."""

    def __init__(self, runner: FakeRunner, config: SchedulerConfig) -> None:
        self.runner = runner
        self.events: list[Event] = []
        self.engine = Engine(runner, config, on_events=self.events.extend, clock=runner.clock)

    def add(self, rid: str, n_prompt: int, max_tokens: int = 8, user: str = "u", **kw) -> None:
        params = SamplingParams(max_tokens=max_tokens, temperature=0, **kw)
        tokens = [10 + (i * 7 + len(rid)) % 900 for i in range(n_prompt)]
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


@pytest.fixture
def make_harness():
    def make(config: SchedulerConfig | None = None, **runner_kw) -> Harness:
        return Harness(FakeRunner(**runner_kw), config or SchedulerConfig())

    return make
