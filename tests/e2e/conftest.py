"""Fixtures of the end-to-end tests: localserve's server on the paced fake runner (`fake`, one
per test module; `stand_in`, the same under the live model's name and chat format) and on the
real model (`live`, one per session), and websocket clients of the live one (`connect`)."""

from __future__ import annotations

import pytest

from localserve.bench.blocking_ws import WS
from tests.support.live import LiveServer, live_config


@pytest.fixture(scope="module")
def fake():
    """localserve's server on the paced FakeRunner (tests/support/fakes.py), one per test module."""
    from localserve.bench.fake_server import FakeServer

    server = FakeServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def stand_in():
    """The paced FakeRunner standing in for the live model, one per test module: served under its
    name, in its chat format, so that a test of what the server does whatever the model says
    sends the real model's tests' bodies, at the fake's speed."""
    from localserve.bench.fake_server import FakeServer

    server = FakeServer(name=live_config().default, chat_format="transcript")
    yield server
    server.close()


@pytest.fixture(scope="session")
def live():
    from localserve.serve.serving import serving

    with serving(live_config(), thread=True) as served:
        yield LiveServer(served)


@pytest.fixture
def connect(live):
    opened: list[WS] = []

    def make() -> WS:
        opened.append(WS(live.url))
        return opened[-1]

    yield make
    for ws in opened:
        ws.close()
