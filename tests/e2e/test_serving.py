"""`serving()` (localserve/serve/serving.py) on the fake runner: the server thread, the engine and
the runner are built, answer /healthz over a real socket, and are torn down in order."""

from __future__ import annotations

import urllib.request


def test_serving_builds_and_tears_down_in_order(monkeypatch):
    """Server thread closed, then engine stopped, then runner closed; a lent runner stays open."""
    import localserve.runners.models
    import localserve.serve.serving as serving_module
    from localserve.config import Config, ModelConfig, ServerConfig
    from localserve.runners.fake import FakeRunner

    order = []

    class Runner(FakeRunner):
        def close(self) -> None:
            order.append("runner")
            super().close()

    class Engine(serving_module.Engine):
        def stop(self, timeout: float = 10.0) -> None:
            order.append("engine")
            super().stop(timeout)

    class Thread(serving_module.ServerThread):
        def close(self) -> None:
            order.append("thread")
            super().close()

    monkeypatch.setattr(localserve.runners.models, "open_runner", lambda config, name: Runner())
    monkeypatch.setattr(serving_module, "Engine", Engine)
    monkeypatch.setattr(serving_module, "ServerThread", Thread)
    model = ModelConfig(chat_format="template")
    server = ServerConfig(shutdown_grace_s=1, engine_process=False)  # the fake runs here
    config = Config(default="fake", models={"fake": model}, server=server)
    with serving_module.serving(config, thread=True) as served:
        assert served.name == "fake" and served.server.runner is served.runner
        with urllib.request.urlopen(served.thread.http + "/healthz", timeout=10) as response:
            assert response.status == 200
    assert order == ["thread", "engine", "runner"]

    order.clear()
    lent = Runner()
    with serving_module.serving(config, "fake", runner=lent) as served:
        assert served.runner is lent and served.thread is None
    assert order == ["engine"]
