"""The server: its models served on one port, from listening to a graceful shutdown.

`Server` wires the parts together and owns their lifecycle: uvicorn on one port (transport.py
bounds every connection), the ASGI app (app.py: websockets, /healthz and /metrics, the chat
page, the OpenAI API under /v1), the pool of models (pool.py: each model's engine, loaded on
demand, evicted and unloaded when idle), admission (admission.py: every chat, whichever way it
came, for whichever model), the routing of engine events back to each request's sink
(routing.py), and the engines' snapshots shared by all who ask (snapshots.py). `run` serves
until SIGINT or SIGTERM; `ServerThread` runs a Server on an event loop of its own (the demo,
the tests).

Tested in tests/e2e/test_websocket_server.py and tests/e2e/test_fake_runner_server.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import uvicorn

from localserve.config import Config, ModelConfig, ServerConfig
from localserve.engine.client import EngineClient
from localserve.engine.runner import Runner
from localserve.ops.auth import Access
from localserve.ops.conversations import ConversationStore
from localserve.ops.people import PeopleStore
from localserve.ops.responses_store import ResponseStore
from localserve.ops.usage import Usage
from localserve.protocol.frames import Notice
from localserve.serve.admission import Admission
from localserve.serve.app import App
from localserve.serve.health import Health
from localserve.serve.model_door import ModelDoor
from localserve.serve.pool import LoadedModel, Loader, ModelPool
from localserve.serve.prompt import PromptBuilder
from localserve.serve.routing import SinkRouter
from localserve.serve.snapshots import Snapshots
from localserve.serve.transport import ConnectionLimits, GuardedHTTP, GuardedWebSocket
from localserve.serve.websocket.connection import CLOSE_GOING_AWAY
from localserve.serve.websocket.connections import Connections

log = logging.getLogger("localserve.serve.server")

# websockets closes the socket (1009) on frames beyond max_frame_bytes + this; below it we
# answer with an error frame. It also bounds what one connection's reader can hold.
FRAME_SLACK_BYTES = 64 << 10
KEEP_ALIVE_S = 5.0  # an idle HTTP connection is closed after this long


class Server:
    """The server of a config's models: the pool, admission, the front-ends, their lifecycle.

    `engine` and `runner` are the default model's, loaded by the caller (serving()), which
    also stops them; `models` (the whole config) and `loader` give the other models, loaded on
    demand (without them only the default is served). `config` and `usage` are what the parts
    read at every use (tests swap them on a live server); `admission` holds the access rules
    and the auth throttle.
    """

    def __init__(
        self,
        engine: EngineClient,
        runner: Runner,
        model: ModelConfig,
        config: ServerConfig,
        access: Access,
        usage: Usage | None = None,
        conversations: ConversationStore | None = None,
        *,
        people: PeopleStore | None = None,
        responses: ResponseStore | None = None,
        models: Config | None = None,
        loader: Loader | None = None,
        name: str | None = None,
        close: Callable[[], None] | None = None,
        models_file: Path | None = None,
    ) -> None:
        self.model = model
        name = name or runner.info.model
        self.config = config
        self.usage = usage  # the record of finished requests, quotas, the access log
        models = models or Config(default=name, models={name: model})
        self.router = SinkRouter(None, lambda: self.usage)  # type: ignore[arg-type]
        self.pool = ModelPool(
            models,
            lambda: self.config,
            loader,
            self.router.on_engine_events,
            default=name,
            models_file=models_file,
        )
        # `close`: how the pool puts the default away when it unloads it (serving()'s, which
        # also runs at the end); without it the default's engine is the caller's to stop
        self.pool.add_loaded(name, LoadedModel(engine, runner, close or (lambda: None)))
        self.admission = Admission(
            self.pool,
            lambda: self.config,
            lambda: self.usage,
            access,
            self.router.on_engine_events,
            people,
        )
        self.router.admission = self.admission
        # the front-ends' door: the default model's (any other model's through its `model`)
        self.door = ModelDoor(self.admission, self.pool.slot(None))
        self.snapshots = Snapshots(self._primary_engine)
        self.connections = self._connections(conversations)
        health = Health(
            self.admission, self.snapshots, self._default_info, lambda: self.usage, self._others
        )
        self.responses = responses  # the Responses API's stored responses (None: none)
        self.app = App(self.door, self.connections, health, responses)
        self.port = 0
        self.limits: ConnectionLimits | None = None  # and the sockets open, once started
        self._uvicorn: uvicorn.Server | None = None
        self._ticker: asyncio.Task | None = None

    # the default model's parts (None while it is unloaded)
    @property
    def model_name(self) -> str:
        return self.pool.default

    @property
    def engine(self) -> EngineClient | None:
        return self.pool.slot(None).engine

    @property
    def runner(self) -> Runner | None:
        loaded = self.pool.slot(None).loaded
        return loaded.runner if loaded is not None else None

    @property
    def prompts(self) -> PromptBuilder | None:
        return self.pool.slot(None).prompts

    def _primary_engine(self) -> EngineClient | None:
        slot = self.pool.primary()
        return slot.engine if slot is not None else None

    def _connections(self, conversations: ConversationStore | None) -> Connections:
        """The websocket connections' registry: each monitor's stats of the model it watches
        (the default's, or its slot's snapshots)."""
        return Connections(
            self.door,
            self.snapshots,
            self._default_info,
            lambda: self.usage,
            conversations,
            lambda name: self.pool.slot(name).snapshots,
        )

    def _others(self) -> list[Snapshots]:
        """The snapshots of the loaded models but the primary (whose are `self.snapshots`)."""
        primary = self.pool.primary()
        return [s.snapshots for s in self.pool.slots.values()
                if s.is_loaded and s is not primary]  # fmt: skip

    def _default_info(self):
        """The ModelInfo of the default model, else of the primary one; None: none loaded."""
        slot = self.pool.primary()
        return slot.loaded.runner.info if slot is not None else None

    async def start(self, host: str, port: int) -> None:
        self.router.loop = asyncio.get_running_loop()
        self.pool.start()
        self.limits = self.connections.limits = ConnectionLimits(
            lambda: self.config, FRAME_SLACK_BYTES
        )
        config = self._uvicorn_config(host, port)
        # what uvicorn.Server.serve() does, without taking over SIGINT and SIGTERM: the server
        # shuts down gracefully on those itself (run() below)
        config.load()
        self._uvicorn = uvicorn.Server(config)
        self._uvicorn.lifespan = config.lifespan_class(config)
        try:
            await self._uvicorn.startup()
        except SystemExit:  # uvicorn exits when it cannot listen (and logs why)
            raise OSError(f"cannot listen on {host}:{port}") from None
        self._ticker = asyncio.create_task(self._uvicorn.main_loop())  # the Date header
        self.port = self._uvicorn.servers[0].sockets[0].getsockname()[1]
        log.info("listening on %s:%d (model %s)", host, self.port, self.model_name)
        if self.usage is not None:
            log.info("usage database: %s", self.usage.path)
            if access_log := self.usage.open_access_log(host):
                log.info("access log: %s", access_log)
        if (store := self.connections.conversations) is not None:
            log.info("conversations kept in: %s", store.path)
        if self.responses is not None:
            log.info("responses kept in: %s", self.responses.path)
        if (people := self.admission.people.store) is not None:
            log.info("people of trusted front-ends kept in: %s", people.path)

    def _uvicorn_config(self, host: str, port: int) -> uvicorn.Config:
        c, limits = self.config, self.limits
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
        return uvicorn.Config(
            self.app,
            host=host,
            port=port,
            http=functools.partial(GuardedHTTP, limits=limits),
            ws=functools.partial(GuardedWebSocket, limits=limits),
            ws_max_size=c.max_frame_bytes + FRAME_SLACK_BYTES,
            # a ping every keepalive_s; no pong within keepalive_s closes with 1008
            ws_ping_interval=c.keepalive_s,
            ws_ping_timeout=c.keepalive_s,
            ws_per_message_deflate=False,  # a deflated frame can grow ~1000x: no bound holds
            interface="asgi3",
            lifespan="off",
            proxy_headers=False,  # X-Forwarded-For must not choose the throttle's key
            log_config=None,
            access_log=False,
            server_header=False,
            timeout_keep_alive=KEEP_ALIVE_S,
            # sockets are capped per place and in all by transport.ConnectionLimits, websockets
            # by max_connections (uvicorn's own cap would refuse /healthz with the rest)
            limit_concurrency=None,
            timeout_graceful_shutdown=5,
        )

    async def shutdown(self) -> None:
        """Stop admitting, tell clients, let replies finish within the grace period, close."""
        admission = self.admission
        if admission.is_shutting_down:
            return
        admission.is_shutting_down = True
        grace = self.config.shutdown_grace_s
        num_requests = len(admission.requests)
        log.info("shutting down: %d requests in flight, %.0f s grace", num_requests, grace)
        notice = Notice("shutting_down", f"server stopping; replies in flight get {grace:g} s")
        self.connections.tell_all(notice)
        await admission.wait_for_requests(grace)
        admission.cancel_all()
        await admission.wait_for_requests(5.0)
        await self.router.wait_for_dones(10.0)  # every `done` out: its row committed first
        await self.connections.flush_all(1.0)
        await self.pool.close()  # the models it loaded: their engine processes exit
        self.connections.close_all(CLOSE_GOING_AWAY, "server shutting down")
        await asyncio.sleep(0.05)  # the close frames go out
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            await self._uvicorn.shutdown()
        if self._ticker is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._ticker


# --- `localserve serve` ---------------------------------------------------------------------


async def run(server: Server, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM, then shut down gracefully."""
    await server.start(host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    pages = ", ".join(f"http://{a}:{server.port}/" for a in browser_addresses(host))
    print(
        f"localserve: serving {server.model_name} on ws://{host}:{server.port} "
        f"and http://{host}:{server.port}/v1 (Ctrl-C stops)\n"
        f"localserve: chat in a browser at {pages}",
        flush=True,
    )
    await stop.wait()
    print("localserve: shutting down", flush=True)
    await server.shutdown()


def browser_addresses(host: str) -> list[str]:
    """Where a browser opens the page: the bound address, or for a wildcard bind this machine's
    loopback and then its addresses on the networks it is on (what a phone types)."""
    if host not in ("0.0.0.0", "::", ""):
        return [f"[{host}]" if ":" in host else host]
    found = ["127.0.0.1"]
    # the address of the default route (connecting a UDP socket sends nothing)
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never a real host
        found.append(probe.getsockname()[0])
    with contextlib.suppress(OSError):
        for *_, address in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.append(address[0])
    shown: list[str] = []
    for address in found:  # 127.0.1.1 and the like (/etc/hosts) are this machine's loopback
        if address not in shown and (address == "127.0.0.1" or not address.startswith("127.")):
            shown.append(address)
    return shown


class ServerThread:
    """A Server on its own event-loop thread: for the demo and for tests."""

    def __init__(self, server: Server, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="localserve-server", daemon=True
        )
        self._thread.start()
        self.call(server.start(host, port))
        self.url = f"ws://{host}:{server.port}"
        self.http = f"http://{host}:{server.port}"

    def call(self, coro, timeout: float | None = 30):
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        """Graceful shutdown, then stop the loop (the engine is the caller's to stop)."""
        with contextlib.suppress(Exception):
            self.call(self.server.shutdown(), timeout=self.server.config.shutdown_grace_s + 15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
