"""Fixtures of the engine's tests: an engine over the fake runner, driven step by step."""

from __future__ import annotations

import pytest

from localserve.config import SchedulerConfig
from localserve.runners.fake import FakeRunner
from tests.support.harness import Harness


@pytest.fixture
def make_harness():
    def make(
        config: SchedulerConfig | None = None, host_cache_bytes: int = 0, disk=None, **runner_kw
    ) -> Harness:
        runner = FakeRunner(**runner_kw)
        return Harness(runner, config or SchedulerConfig(), host_cache_bytes, disk)

    return make
