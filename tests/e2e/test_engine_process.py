"""EngineProcess's lifecycle with the embedded model: it starts when the server is PID 1 (a
container's entrypoint), a reload that keeps failing backs off, and stop() after a restart ends
the engine process with its own Stop, not with SIGKILL."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import msgspec
import pytest

from tests.support.ci import cannot_run_here
from tests.support.live import live_config
from tests.support.paths import ROOT
from tests.support.waiting import wait_until

pytestmark = pytest.mark.model


def test_the_engine_starts_when_the_server_is_pid_1():
    """`docker run` with an exec-form entrypoint: the server is PID 1, so its child's
    getppid() is 1 although its parent is alive."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--pid", "--fork", "true"]).returncode:
        cannot_run_here("no PID namespaces here (unshare --pid)")
    script = textwrap.dedent(
        """
        import os, sys
        from tests.support.live import live_config
        from localserve.engine_process.parent import EngineProcess
        assert os.getpid() == 1
        config = live_config()
        EngineProcess(config, config.default).start().stop()
        print("served")
        """
    )
    done = subprocess.run(
        [unshare, "--pid", "--fork", sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "served" in done.stdout, done.stderr[-1500:]


def test_a_reload_that_keeps_failing_backs_off():
    from localserve.engine_process.parent import EngineProcess

    config = live_config()
    engine = EngineProcess(config, config.default).start()
    try:
        launches = []
        launch = engine._launch
        engine._launch = lambda: (launches.append(time.monotonic()), launch())
        gone = msgspec.structs.replace(
            config.models[config.default], embedded=False, path="/nonexistent.gguf"
        )
        engine.config = msgspec.structs.replace(config, models={config.default: gone})
        os.kill(engine._process.pid, signal.SIGKILL)
        # launched again after 1 s, failed, then after 2 s more: the second gap is not waited
        # for (5 s), a reload every second shows in the first
        wait_until(lambda: len(launches) >= 2, 30, "a second launch")
        wait_until(lambda: "reloading failed" in engine.problem, 30, "the failure said")
        assert "nonexistent" in engine.problem
        gaps = [b - a for a, b in zip(launches, launches[1:], strict=False)]
        assert gaps[-1] > 1.9, gaps
    finally:
        engine.stop()


def test_stop_after_a_restart_ends_the_engine_process_with_stop():
    """The restarted process was started by the watchdog's thread: PR_SET_PDEATHSIG kills it
    when that thread ends, so the watchdog must outlive it."""
    from localserve.engine_process.parent import EngineProcess

    config = live_config()
    engine = EngineProcess(config, config.default).start()
    os.kill(engine._process.pid, signal.SIGKILL)
    wait_until(lambda: engine.restarts == 1, 60, "a restart")
    process = engine._process
    engine.stop()
    assert process.returncode == 0  # not -SIGKILL


def test_embeddings_cross_the_engine_process_pipe():
    """AddEmbedding goes to the engine process and Embedded then Done come back (msgpack); the
    server's side refuses what the engine would; the step clock sees the embedding step."""
    import numpy as np

    from localserve.engine.events import Done, Embedded, EventRouter
    from localserve.engine.sampling_params import SamplingParams
    from localserve.engine_process.parent import EngineProcess

    config = live_config()
    router = EventRouter()
    engine = EngineProcess(config, config.default)
    engine.on_events = router
    engine.start()
    try:
        info = engine.runner.info
        assert (info.n_embd, info.pooling, info.max_embed_tokens) == (640, "mean", 512)
        with pytest.raises(ValueError, match="too_long"):
            engine.add_embedding("long", [[2] * 513])
        with pytest.raises(ValueError, match="outside"):
            engine.add_embedding("bad", [[2, info.n_vocab]])
        inputs = [engine.runner.tokenize(t) for t in ("a red apple", "a green pear", "tax law")]
        chat, emb = router.open("chat"), router.open("emb")
        params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
        engine.add_request("chat", engine.runner.tokenize("Once upon a time"), params)
        engine.add_embedding("emb", inputs, user="bob", client_id="my-emb")
        first, second = emb.get(timeout=120), emb.get(timeout=120)
        assert isinstance(first, Embedded) and isinstance(second, Done)
        vectors = np.array(first.vectors)
        assert vectors.shape == (3, 640)
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        assert second.finish_reason == "stop" and second.prompt_tokens == sum(map(len, inputs))
        while not isinstance(event := chat.get(timeout=120), Done):
            pass
        assert event.completion_tokens == 30
        snap = engine.snapshot().result(timeout=30)
        assert snap.counters.embed_requests == 1 and snap.counters.embed_inputs == 3
    finally:
        engine.stop()
