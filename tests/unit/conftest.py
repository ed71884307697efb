"""Fixtures of the fast tests: deterministic snapshots of a (fake) engine serving four people."""

from __future__ import annotations

import pytest

from localserve.engine.engine import Engine
from localserve.engine.sampling_params import SamplingParams
from localserve.engine.snapshot import build_snapshot
from localserve.runners.fake import FakeRunner


@pytest.fixture
def fake_snapshots():
    """Deterministic snapshots of four people sharing a (fake) model, one per engine step."""
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
