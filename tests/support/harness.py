"""An engine over the deterministic fake runner, driven step by step (`make_harness`)."""

from __future__ import annotations

import zlib

from localserve.config import SchedulerConfig
from localserve.engine.engine import Engine
from localserve.engine.events import Done, Event, Token
from localserve.engine.runner import apply_cell_ops
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


def run_checked(h, max_steps: int = 10_000) -> None:
    """Run to the end, checking after every step that the pool and the cache agree.

    The cell operations decided after a step's decode travel with the next batch; applying
    them here, early, changes nothing (nothing else touches the cache in between).
    """
    for _ in range(max_steps):
        h.step()
        kv, runner = h.kv, h.runner
        apply_cell_ops(runner, kv.take_ops())
        assert kv.num_used == runner.num_cells_in_use
        assert kv.num_used <= kv.num_committed <= kv.num_cells
        for seq in h.engine.scheduler.running:
            assert runner.seq_num_cells(seq.seq_id) == seq.num_computed
        for prefix in kv.prefixes:
            assert runner.seq_num_cells(prefix.seq_id) == len(prefix.tokens)
        running, prefixes = h.engine.scheduler.running, kv.prefixes
        ids = [s.seq_id for s in running] + [p.seq_id for p in prefixes]
        assert len(set(ids)) == len(ids) and not set(ids) & set(kv._free_ids)
        assert not any(cells for i, cells in runner.cells.items() if i not in ids)
        for root in (p for p in prefixes if p.is_system):  # a root knows who shares its cells
            sharing = [x for x in (*running, *prefixes) if x.system is root]
            assert root.refs == len(sharing)
        own = sum(s.num_computed - s.num_system for s in running) + sum(p.num_own for p in prefixes)
        assert own == kv.num_used  # each cell counted once
        if not h.engine.scheduler.has_work:
            return
    raise AssertionError("engine did not drain")
