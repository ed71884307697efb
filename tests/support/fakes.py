"""localserve's server on the FakeRunner, assembled by `serving()` as the real one is.

`FakeServer` has the `live` fixture's interface (server, config, call, url, http, snapshot,
wait_idle), so `support.live.configured` and `support.live.WS` work on it unchanged; its runner
sleeps a little each step, so replies take real time (a request can be cancelled or refused
while the previous one still runs) without a model.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from localserve.engine.batch import Sampled
from localserve.runners.fake import EOG, FakeRunner
from tests.support.waiting import wait_until


@dataclass
class PacedRunner(FakeRunner):
    """The fake runner, but each step takes `step_s` of real time (as a model's would)."""

    step_s: float = 0.002

    def run(self, batch):
        if batch.items:
            time.sleep(self.step_s)
        return super().run(batch)


@dataclass
class WideRunner(PacedRunner):
    """The paced fake runner with `width` bytes of text a token: replies that fill a socket
    in a moment, as a fast model's would after a while."""

    width: int = 2048

    def piece(self, token: int) -> bytes:
        piece = super().piece(token)
        return piece * (self.width // len(piece)) if piece else piece


@dataclass
class ScriptedRunner(PacedRunner):
    """The paced fake runner, but every reply is `reply`, one piece per token (with a
    `template_source` that shows `<think>`, its reply's reasoning is read apart)."""

    reply: list[str] = field(default_factory=list)

    def _sample(self, item):
        n = len(item.seq.tokens) - item.seq.num_prompt_tokens
        if n >= len(self.reply):
            return Sampled(item.seq, EOG, b"", True)
        return Sampled(item.seq, 100 + n, self.reply[n].encode(), False)


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

        return wait_until(idle, timeout, "the server is idle", interval=0.02)

    def connections_of(self, prefix: str) -> list:
        """The server's connections whose user name starts with `prefix` (read on its loop)."""
        return connections_of(self, prefix)

    def close(self) -> None:
        self._stack.close()
        self.runner.close()


def prefilling(server, user: str):
    """The user's row once its prefill has computed a chunk (it may start at a cached prefix)."""
    rows = [s for s in server.snapshot().seqs if s.user == user]
    return next(
        (s for s in rows if s.phase == "prefill" and s.computed_tokens > s.cached_tokens), None
    )


def connections_of(server, prefix: str) -> list:
    """A live or fake server's connections whose user starts with `prefix` (on its loop)."""

    async def find():
        return [c for c in server.server.connections if (c.user or "").startswith(prefix)]

    return server.call(find())


# --- clients -----------------------------------------------------------------------------------


FAKE_LOAD_S = 0.3  # a fake model's load takes this long, so that it can be seen loading
TWO_FAKE_MODELS = """
[server]
max_loaded_models = 1
memory_budget_mib = 1000
shutdown_grace_s = 1
state_dir = "{state}"

[models.first]
path = "/nowhere/first.gguf"
chat_format = "transcript"

[models.second]
path = "/nowhere/second.gguf"
chat_format = "transcript"
"""


@contextlib.contextmanager
def two_fake_models(state, monkeypatch, access=None):
    """A server with two models on paced fake runners ("first", the default, loaded; "second"
    loaded on demand in FAKE_LOAD_S, max_loaded_models = 1: a swap), from a parsed models.toml;
    its usage record in `state`. Yields serving()'s ServedModel (`.thread` listens)."""
    from localserve.config import parse_config
    from localserve.engine.engine import Engine
    from localserve.serve import serving as serving_module
    from localserve.serve.pool import LoadedModel

    config = parse_config(TWO_FAKE_MODELS.format(state=state))

    def fake_load(config, name: str) -> LoadedModel:  # as serving.load_model, on a fake runner
        time.sleep(FAKE_LOAD_S)
        runner = PacedRunner()
        engine = Engine(runner, config.scheduler).start()
        return LoadedModel(engine, runner, engine.stop)

    monkeypatch.setattr(serving_module, "load_model", fake_load)
    runner = PacedRunner()
    try:
        with serving_module.serving(config, runner=runner, thread=True, access=access) as made:
            yield made
    finally:
        runner.close()
