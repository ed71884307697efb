"""An engine over the deterministic fake runner, driven step by step (`make_harness`)."""

from __future__ import annotations

import zlib

from localserve.config import SchedulerConfig
from localserve.engine.engine import Engine
from localserve.engine.events import Done, Event, Token
from localserve.engine.sampling_params import SamplingParams
from localserve.runners.fake import FakeRunner


class Harness:
    """An engine on a FakeRunner with a fake clock; collects events per request."""

    def __init__(
        self, runner: FakeRunner, config: SchedulerConfig, host_cache_bytes: int = 0, disk=None
    ) -> None:
        self.runner = runner
        self.events: list[Event] = []
        self.engine = Engine(
            runner,
            config,
            on_events=self.events.extend,
            clock=runner.clock,
            host_cache_bytes=host_cache_bytes,
            disk=disk,
        )

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
