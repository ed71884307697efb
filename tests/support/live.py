"""The real server on loopback, port 0, with the real default model (the `live` fixture), and
changing its limits for a while (configured). The blocking websocket client the tests speak to a
live or fake server with is localserve/bench/blocking_ws.py's `WS`."""

from __future__ import annotations

import contextlib

import msgspec

from localserve.config import SchedulerConfig


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
    old = server.config, admission.access, admission.authentication.throttle
    server.config = msgspec.structs.replace(server.config, **limits)
    admission.access = access or admission.access
    admission.authentication.throttle = AuthThrottle(server.config.max_auth_failures_per_minute)
    try:
        yield server
    finally:
        server.config, admission.access, admission.authentication.throttle = old


def live_config(n_ctx: int = 4096):
    """The embedded model, small batches, 2 threads: quick on a laptop's CPU. (The tests of the
    real model run in one process, whatever the suite's: tests/conftest.py.)"""
    from localserve.config import Config, ModelConfig, ServerConfig

    model = ModelConfig(
        embedded=True,
        chat_format="transcript",
        chat_template="gemma",
        n_ctx=n_ctx,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        n_threads=2,
        keep_alive=-1,  # the session's server keeps its model, however long a test idles
    )
    return Config(
        default="gemma-3-270m",
        models={"gemma-3-270m": model},
        scheduler=SchedulerConfig(),
        server=ServerConfig(max_frame_bytes=64 * 1024, shutdown_grace_s=2),
    )
