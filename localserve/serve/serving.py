"""`serving()`: a model served, from a config to a listening server, and back down in order.

One assembly for `localserve serve`, `demo` and `sweep` and for the tests' live server: the
default model's runner (llama.cpp) is loaded, an engine started on it, a `Server` (server.py)
wired to both and to `load_model`, which loads the config's other models when asked for;
and, when asked, started as a `ServerThread` on its own event loop. What was built comes back
as a `ServedModel`. On the way out the server stops first (in-flight replies get the
configured grace), then the engine, then the runner is closed.

Tested in tests/e2e/test_serving.py.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from localserve.config import Config, configured_model
from localserve.engine.engine import Engine
from localserve.engine.runner import Runner
from localserve.engine_process.parent import EngineProcess
from localserve.ops.auth import Access
from localserve.ops.conversations import ConversationStore
from localserve.ops.people import PeopleStore
from localserve.ops.responses_store import ResponseStore
from localserve.ops.usage import Usage
from localserve.serve.pool import LoadedModel
from localserve.serve.server import Server, ServerThread


@dataclass
class ServedModel:
    """What `serving()` built; `thread` is None unless it was asked to listen on a thread."""

    name: str  # the model's name in the config
    runner: Runner
    engine: Engine | EngineProcess
    server: Server
    thread: ServerThread | None = None


@contextlib.contextmanager
def serving(
    config: Config,
    model: str | None = None,
    *,
    access: Access | None = None,
    runner: Runner | None = None,
    thread: bool = False,
    models_file: Path | None = None,
) -> Iterator[ServedModel]:
    """Serve `model` (the config's default when None) as `config` says.

    access: who may connect (default: anyone, no tokens). runner: an already loaded runner to
    reuse, which then stays open afterwards (the sweep runs several engines on one model).
    thread: start listening on 127.0.0.1, any free port, on a thread of its own (`.thread.url`);
    otherwise the caller runs the server (`server.run(served.server, host, port)`).
    models_file: the models.toml `config` came from, where a pull adds (None: built in).
    """
    name = configured_model(config, model)  # ConfigError for a model it does not have
    with contextlib.ExitStack() as stack:
        usage = None
        if config.server.usage:  # first: a bad database is said before the model loads
            usage = Usage(config.server, name)
            stack.callback(usage.close)  # last: after the server has sent every `done`
        access = access or Access({})
        conversations = None
        if config.server.conversations and access.requires_tokens:  # else: in the browser
            conversations = ConversationStore.open(config.server)
            stack.callback(conversations.close)  # after the server's last save
        people = None
        if config.server.trusted_frontends and access.requires_tokens:  # else: nobody named
            people = PeopleStore.open(config.server)
            stack.callback(people.close)  # after the server's last binding
        responses = _responses_store(config, stack)
        if runner is None:  # in an engine process of its own (watched), or in this one
            loaded = load_model(config, name)
        else:  # the caller's runner: only the engine is ours to stop
            loaded = LoadedModel(_engine_on(config, name, runner), runner, lambda: None)
            loaded.close = loaded.engine.stop
        close = _once(loaded.close)  # by the pool when it unloads the default, else here
        stack.callback(close)
        engine, runner = loaded.engine, loaded.runner
        server = Server(
            *(engine, runner, config.models[name], config.server, access, usage, conversations),
            models=config,
            people=people,
            responses=responses,
            loader=lambda other: load_model(config, other),
            name=name,
            close=close,
            models_file=models_file,
        )
        served = ServedModel(name, runner, engine, server)
        if thread:
            served.thread = ServerThread(server)
            stack.callback(served.thread.close)
        yield served


def _responses_store(config: Config, stack: contextlib.ExitStack) -> ResponseStore | None:
    """The Responses API's stored responses (its `store`), closed after the server's last
    reply; None when `[server] responses_store = false`."""
    if not config.server.responses_store:
        return None
    store = ResponseStore.open(config.server)
    stack.callback(store.close)
    return store


def load_model(config: Config, name: str) -> LoadedModel:
    """Another model of the config, loaded on demand (pool.py, on a worker thread): in an
    engine process of its own, or (engine_process = false) in this one. Raises when it cannot."""
    if config.server.engine_process:
        engine = EngineProcess(config, name).start()
        return LoadedModel(engine, engine.runner, engine.stop)
    from localserve.runners.models import open_runner

    runner = open_runner(config, name)
    try:
        from localserve.runners.prefix_disk import open_prefix_tiers

        host_cache, disk = open_prefix_tiers(config, name, runner)  # the prefix cache's tiers
        engine = Engine(runner, config.scheduler, host_cache_bytes=host_cache, disk=disk).start()
    except BaseException:
        runner.close()
        raise

    def close() -> None:
        engine.stop()
        runner.close()

    return LoadedModel(engine, runner, close)


def _engine_on(config: Config, name: str, runner: Runner) -> Engine:
    """An engine on the caller's runner, started: with a host tier, but no disk tier (the
    runner may serve several engines one after another, the sweep's, whose saved prefixes
    must not carry from one to the next; a fake runner has no model file to name states by)."""
    from localserve.runners.footprint import host_cache_bytes

    cache = host_cache_bytes(config.models[name])
    return Engine(runner, config.scheduler, host_cache_bytes=cache).start()


def _once(close: Callable[[], None]) -> Callable[[], None]:
    """`close`, done at most once (the pool may unload what the exit stack also closes)."""
    lock, done = threading.Lock(), []

    def closing() -> None:
        with lock:
            if done:
                return
            done.append(True)
        close()

    return closing
