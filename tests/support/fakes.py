"""The fake runners and servers some tests need beyond localserve/bench/fake_server.py's
`FakeServer` and `PacedRunner`: a runner of wide tokens (WideRunner) or of one scripted reply
(ScriptedRunner), a row caught mid-prefill (prefilling), and a server of two fake models that
swap (two_fake_models).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from localserve.bench.fake_server import PacedRunner
from localserve.engine.batch import Sampled
from localserve.runners.fake import EOG


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


def prefilling(server, user: str):
    """The user's row once its prefill has computed a chunk (it may start at a cached prefix)."""
    rows = [s for s in server.snapshot().seqs if s.user == user]
    return next(
        (s for s in rows if s.phase == "prefill" and s.computed_tokens > s.cached_tokens), None
    )


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
def two_fake_models(state, monkeypatch, access=None, load_s: float = FAKE_LOAD_S):
    """A server with two models on paced fake runners ("first", the default, loaded; "second"
    loaded on demand in `load_s`, max_loaded_models = 1: a swap), from a parsed models.toml;
    its usage record in `state`. Yields serving()'s ServedModel (`.thread` listens)."""
    from localserve.config import parse_config
    from localserve.engine.engine import Engine
    from localserve.serve import serving as serving_module
    from localserve.serve.pool import LoadedModel

    config = parse_config(TWO_FAKE_MODELS.format(state=state))

    def fake_load(config, name: str) -> LoadedModel:  # as serving.load_model, on a fake runner
        time.sleep(load_s)
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
