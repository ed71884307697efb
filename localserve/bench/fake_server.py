"""localserve's server on the fake runner, assembled by `serving()` as the real one is: what a
benchmark of the server's own costs runs on (the engine costs next to nothing), and what the
tests that need a server but no model run on.

`FakeServer` has the live server's interface (server, config, call, url, http, snapshot,
wait_idle), so what speaks to a live server works on it unchanged; its runner
(`PacedRunner`) sleeps a little each step, so replies take real time (a request can be cancelled
or refused while the previous one still runs) without a model.

Tested in tests/e2e/test_fake_runner_server.py.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from localserve.runners.fake import FakeRunner


@dataclass
class PacedRunner(FakeRunner):
    """The fake runner, but each step takes `step_s` of real time (as a model's would)."""

    step_s: float = 0.002

    def run(self, batch):
        if batch.items:
            time.sleep(self.step_s)
        return super().run(batch)


class FakeServer:
    """localserve's Server on its own event-loop thread over the paced fake runner, assembled by
    `serving()` as the real one is; its one model is called `name`."""

    def __init__(
        self,
        step_s: float = 0.002,
        n_ctx: int = 4096,
        n_seq_max: int = 8,
        chat_format: str = "template",
        runner: PacedRunner | None = None,
        access=None,
        name: str = "fake",
        **config,
    ) -> None:
        from localserve.config import Config, ModelConfig, ServerConfig
        from localserve.serve.serving import serving

        self.runner = runner or PacedRunner(n_ctx=n_ctx, n_seq_max=n_seq_max, step_s=step_s)
        self.config = ServerConfig(
            **({"max_frame_bytes": 64 * 1024, "shutdown_grace_s": 1} | config)
        )
        self.model = ModelConfig(chat_format=chat_format, keep_alive=-1)  # kept while it runs
        whole = Config(default=name, models={name: self.model}, server=self.config)
        self._stack = contextlib.ExitStack()
        served = self._stack.enter_context(
            serving(whole, runner=self.runner, thread=True, access=access)
        )
        self.engine, self.server, self.thread = served.engine, served.server, served.thread
        self.call, self.url, self.http = self.thread.call, self.thread.url, self.thread.http

    def snapshot(self):
        return self.call(self.server.snapshots.fetch())

    def wait_idle(self, timeout: float = 30.0):
        """Wait until nothing runs or waits and only cached prefixes hold cells; return it."""

        def idle():
            snap = self.snapshot()
            return snap if snap.running == snap.waiting == snap.kv_live == 0 else None

        deadline = time.monotonic() + timeout
        while not (snap := idle()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"not within {timeout} s: the server is idle")
            time.sleep(0.02)
        return snap

    def connections_of(self, prefix: str) -> list:
        """The server's connections whose user name starts with `prefix` (read on its loop)."""
        return connections_of(self, prefix)

    def close(self) -> None:
        self._stack.close()
        self.runner.close()


def connections_of(server, prefix: str) -> list:
    """A live or fake server's connections whose user starts with `prefix` (on its loop)."""

    async def find():
        return [c for c in server.server.connections if (c.user or "").startswith(prefix)]

    return server.call(find())
