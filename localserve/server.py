"""The websocket chat server: many users, many requests each, one engine.

The asyncio loop owns the sockets; the engine thread owns the model. Frames are decoded by one
reused msgspec decoder into the closed union of client frames; every problem with a frame is
an `error` frame and the connection goes on. Engine events come back through
`call_soon_threadsafe` and are routed to the connection that owns the request; token text
waiting for a slow reader is coalesced into one frame per request, so a connection's outbox is
bounded. HTTP on the same port: `GET /healthz` (JSON) and `GET /metrics` (Prometheus text).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import signal
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import NamedTuple

import msgspec
from websockets.asyncio.server import Server as WsServer
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from localserve import __version__, prometheus
from localserve.auth import Access, check_user_name
from localserve.config import ModelConfig, ServerConfig
from localserve.engine import Admitted, Done, Engine, Event, Preempted, Token
from localserve.kv import common_prefix
from localserve.prompt import render_chat
from localserve.protocol import (
    Cancel,
    Chat,
    ClientFrame,
    Error,
    Finished,
    Hello,
    Limits,
    Notice,
    Queued,
    Snapshot,
    Stats,
    Subscribe,
    Timings,
    TokenDelta,
    Usage,
    Welcome,
)
from localserve.runner import Runner
from localserve.sequence import SamplingParams

log = logging.getLogger("localserve.server")

MAX_ID_LENGTH = 128
MAX_FAILED_HELLOS = 3
MAX_OUTBOX_FRAMES = 1024  # a client that stops reading is disconnected, not buffered forever
MIN_STATS_INTERVAL_MS = 50
HARD_FRAME_LIMIT_FACTOR = 4  # websockets closes the socket beyond this; we answer below it

_decoder = msgspec.json.Decoder(ClientFrame)
_encoder = msgspec.json.Encoder()


class _IdOnly(msgspec.Struct):
    id: str | None = None


@dataclass(eq=False)
class Request:
    """A chat in flight: which connection owns it, under which ids."""

    engine_id: str
    client_id: str
    conn: Connection
    is_waiting: bool = True


class Outbox:
    """Frames waiting to be written; token text for a request is merged while it waits."""

    def __init__(self) -> None:
        self._frames: deque = deque()
        self._open_text: dict[str, TokenDelta] = {}
        self._stats: Stats | None = None
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._frames)

    def put(self, frame) -> None:
        self._frames.append(frame)
        self._ready.set()

    def put_text(self, client_id: str, text: str) -> None:
        pending = self._open_text.get(client_id)
        if pending is not None:
            pending.text += text  # coalesce: the client has not read the last delta yet
            return
        self._open_text[client_id] = frame = TokenDelta(client_id, text)
        self.put(frame)

    def put_stats(self, stats: Stats) -> None:
        """Only the newest snapshot is worth sending."""
        if self._stats is None:
            self.put(stats)
        else:
            self._frames[self._frames.index(self._stats)] = stats
        self._stats = stats

    async def get(self):
        while not self._frames:
            self._ready.clear()
            await self._ready.wait()
        frame = self._frames.popleft()
        if isinstance(frame, TokenDelta) and self._open_text.get(frame.id) is frame:
            del self._open_text[frame.id]
        elif frame is self._stats:
            self._stats = None
        return frame

    @property
    def is_empty(self) -> bool:
        return not self._frames


class Connection:
    """One websocket: its user, its requests, its outbox."""

    def __init__(self, server: Server, ws: ServerConnection, num: int) -> None:
        self.server = server
        self.ws = ws
        self.num = num
        self.user: str | None = None
        self.requests: dict[str, Request] = {}  # by the client's id
        self.outbox = Outbox()
        self.is_closed = False
        self.failed_hellos = 0
        self._stats_task: asyncio.Task | None = None

    async def run(self) -> None:
        writer = asyncio.create_task(self._write())
        try:
            async for message in self.ws:
                await self.handle(message)
        except ConnectionClosed:
            pass
        finally:
            self.is_closed = True
            writer.cancel()
            if self._stats_task:
                self._stats_task.cancel()
            self.server.drop(self)

    def send(self, frame) -> None:
        if self.is_closed:
            return
        self.outbox.put(frame)
        self._check_backlog()

    def send_text(self, client_id: str, text: str) -> None:
        if not self.is_closed:
            self.outbox.put_text(client_id, text)
            self._check_backlog()

    def error(self, code: str, message: str, client_id: str | None = None) -> None:
        self.send(Error(code, message, client_id))

    def _check_backlog(self) -> None:
        if len(self.outbox) > MAX_OUTBOX_FRAMES:
            log.warning("connection %d (%s) is not reading; closing it", self.num, self.user)
            self.is_closed = True
            asyncio.ensure_future(self.ws.close(1008, "too many unread frames"))

    async def _write(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                frame = await self.outbox.get()
                await self.ws.send(_encoder.encode(frame), text=True)

    async def _close_after_flush(self, code: int, reason: str) -> None:
        await self.flush(1.0)
        await self.ws.close(code, reason)

    async def flush(self, timeout: float) -> None:
        """Wait (a little) until everything queued has been handed to the socket."""
        with contextlib.suppress(asyncio.TimeoutError):
            async with asyncio.timeout(timeout):
                while not self.outbox.is_empty and not self.is_closed:
                    await asyncio.sleep(0.01)

    # --- frames in --------------------------------------------------------------------------

    async def handle(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            return self.error("bad_request", "binary frames are not supported; send JSON text")
        limit = self.server.config.max_frame_bytes
        size = len(message) if len(message) * 4 <= limit else len(message.encode())
        if size > limit:
            return self.error("bad_request", f"frame of {size} bytes exceeds {limit}")
        try:
            frame = _decoder.decode(message)
        except msgspec.DecodeError as e:
            return self.error("bad_request", f"invalid frame: {e}", _recover_id(message))
        if isinstance(frame, Hello):
            self._hello(frame)
        elif isinstance(frame, Subscribe):
            self._subscribe(frame)
        elif self.user is None:
            self.error("unauthorized", "say hello first", getattr(frame, "id", None))
        elif isinstance(frame, Chat):
            await self.server.chat(self, frame)
        elif isinstance(frame, Cancel):
            self._cancel(frame)

    def _hello(self, hello: Hello) -> None:
        if self.user is not None:
            return self.error("bad_request", f"already said hello as {self.user!r}")
        if not check_user_name(hello.user):
            return self.error("bad_request", "user: 1-64 printable characters, no outer spaces")
        if not self.server.access.allows_user(hello.user, hello.token):
            log.warning("connection %d: unauthorized hello as %r", self.num, hello.user)
            self.failed_hellos += 1
            self.error("unauthorized", "unknown user or wrong token")
            if self.failed_hellos >= MAX_FAILED_HELLOS:  # no guessing tokens on one socket
                asyncio.ensure_future(self._close_after_flush(1008, "too many failed hellos"))
            return None
        self.user = hello.user
        self.send(self.server.welcome())

    def _subscribe(self, sub: Subscribe) -> None:
        if not self.server.access.allows_monitor(sub.token):
            return self.error("unauthorized", "stats need the server's monitor token")
        if self._stats_task:
            self._stats_task.cancel()
            self._stats_task = None
        if sub.interval_ms > 0:
            interval = max(sub.interval_ms, MIN_STATS_INTERVAL_MS) / 1e3
            self._stats_task = asyncio.create_task(self._stream_stats(interval))

    async def _stream_stats(self, interval_s: float) -> None:
        while not self.is_closed:
            self.outbox.put_stats(Stats(await self.server.snapshot()))
            await asyncio.sleep(interval_s)

    def _cancel(self, cancel: Cancel) -> None:
        if len(cancel.id) > MAX_ID_LENGTH:
            return self.error("bad_request", f"id: 1-{MAX_ID_LENGTH} characters")
        request = self.requests.get(cancel.id)
        if request is None:  # also the answer for another connection's ids: nothing leaks
            return self.error("unknown_id", f"no request {cancel.id!r} in flight here", cancel.id)
        self.server.engine.cancel(request.engine_id)


def _recover_id(message: str) -> str | None:
    """The `id` of a frame that failed validation, so the error can name the request."""
    try:
        found = msgspec.json.decode(message, type=_IdOnly)
    except msgspec.DecodeError:
        return None
    return found.id


@dataclass
class _Counts:
    waiting: int = 0
    waiting_per_user: dict[str, int] = field(default_factory=dict)
    inflight_per_user: dict[str, int] = field(default_factory=dict)


class Prompt(NamedTuple):
    tokens: list[int]
    stops: tuple[str, ...]
    system_tokens: int  # the first ones are a system prompt that other requests may share
    is_default_system: bool  # the server's own system prompt: shared with every user


class Server:
    """Connections on one side, the engine on the other."""

    def __init__(
        self,
        engine: Engine,
        runner: Runner,
        model: ModelConfig,
        config: ServerConfig,
        access: Access,
    ) -> None:
        self.engine = engine
        self.runner = runner
        self.model = model
        self.config = config
        self.access = access
        self.requests: dict[str, Request] = {}  # by engine id
        self.connections: set[Connection] = set()
        self.counts = _Counts()
        self.is_shutting_down = False
        self.port = 0
        self._numbers = itertools.count(1)
        self._ws: WsServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        engine.on_events = self._on_engine_events
        # the same system prompt comes with every chat: tokenize it once (thread-safe cache)
        self._system_tokens = functools.lru_cache(maxsize=64)(runner.tokenize)

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._ws = await serve(
            self._handle,
            host,
            port,
            process_request=self._process_request,
            max_size=self.config.max_frame_bytes * HARD_FRAME_LIMIT_FACTOR,
            max_queue=64,
        )
        self.port = next(iter(self._ws.sockets)).getsockname()[1]
        log.info("listening on ws://%s:%d (model %s)", host, self.port, self.runner.info.model)

    async def shutdown(self) -> None:
        """Stop admitting, tell clients, let replies finish within the grace period, close."""
        if self.is_shutting_down:
            return
        self.is_shutting_down = True
        grace = self.config.shutdown_grace_s
        log.info("shutting down: %d requests in flight, %.0f s grace", len(self.requests), grace)
        for conn in list(self.connections):
            conn.send(
                Notice("shutting_down", f"server stopping; replies in flight get {grace:g} s")
            )
        await self._wait_for_requests(grace)
        for request in list(self.requests.values()):
            self.engine.cancel(request.engine_id)
        await self._wait_for_requests(5.0)
        await asyncio.gather(*(c.flush(1.0) for c in self.connections))
        if self._ws is not None:
            self._ws.close()
            await self._ws.wait_closed()

    async def _wait_for_requests(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            async with asyncio.timeout(timeout):
                while self.requests:
                    await asyncio.sleep(0.02)

    async def _handle(self, ws: ServerConnection) -> None:
        conn = Connection(self, ws, next(self._numbers))
        self.connections.add(conn)
        await conn.run()

    def drop(self, conn: Connection) -> None:
        """A closed connection: cancel its requests (their cells are freed at the next step)."""
        self.connections.discard(conn)
        for request in conn.requests.values():
            self.engine.cancel(request.engine_id)

    def welcome(self) -> Welcome:
        c = self.config
        limits = Limits(c.max_frame_bytes, c.max_tokens, c.max_inflight_per_user,
                        c.max_queued_per_user, c.max_queued)  # fmt: skip
        return Welcome(self.runner.info.model, self.runner.info.n_ctx, limits, __version__)

    async def snapshot(self) -> Snapshot:
        return await asyncio.wrap_future(self.engine.snapshot())

    # --- chats ----------------------------------------------------------------------------------

    async def chat(self, conn: Connection, chat: Chat) -> None:
        """Validate, check limits, render and tokenize, hand to the engine."""
        problem = self._check_chat(conn, chat)
        if problem:
            code, message = problem
            if code in ("busy", "shutting_down"):
                self.engine.reject()
            return conn.error(code, message, chat.id)
        try:
            params = self._params(chat)
        except ValueError as e:
            return conn.error("bad_request", str(e), chat.id)
        request = self._open(conn, chat.id)
        try:
            prompt = await asyncio.to_thread(self._tokenize, chat)
            tokens = prompt.tokens
            if not chat.ignore_eos:  # the format's end of turn is an EOS in all but name
                params = msgspec.structs.replace(params, stop=params.stop + prompt.stops)
        except ValueError as e:
            self._close(request)
            return conn.error("bad_request", str(e), chat.id)
        n_ctx = self.runner.info.n_ctx
        if len(tokens) >= n_ctx:
            self._close(request)
            self.engine.reject()
            message = f"the prompt has {len(tokens)} tokens; the context holds {n_ctx}"
            return conn.error("too_long", message, chat.id)
        if conn.is_closed:
            return self._close(request)
        self.engine.add_request(
            request.engine_id, tokens, params, user=conn.user,
            shared_prefix_tokens=prompt.system_tokens, share_globally=prompt.is_default_system,
        )  # fmt: skip
        conn.send(Queued(chat.id, self.counts.waiting))

    def _check_chat(self, conn: Connection, chat: Chat) -> tuple[str, str] | None:
        c, user = self.config, conn.user
        if self.is_shutting_down:
            return "shutting_down", "the server is shutting down"
        if not chat.id or len(chat.id) > MAX_ID_LENGTH:
            return "bad_request", f"id: 1-{MAX_ID_LENGTH} characters"
        if chat.id in conn.requests:
            return "bad_request", f"id {chat.id!r} is already in flight on this connection"
        if chat.max_tokens > c.max_tokens:
            return "bad_request", f"max_tokens: at most {c.max_tokens} on this server"
        if self.counts.inflight_per_user.get(user, 0) >= c.max_inflight_per_user:
            return "busy", f"{c.max_inflight_per_user} requests of yours are already in flight"
        if self.counts.waiting_per_user.get(user, 0) >= c.max_queued_per_user:
            return "busy", f"{c.max_queued_per_user} requests of yours are already queued"
        if self.counts.waiting >= c.max_queued:
            return "busy", f"the queue is full ({c.max_queued} waiting); try again shortly"
        return None

    def _params(self, chat: Chat) -> SamplingParams:
        return SamplingParams(
            max_tokens=chat.max_tokens,
            temperature=chat.temperature,
            top_k=chat.top_k,
            top_p=chat.top_p,
            min_p=chat.min_p,
            repeat_penalty=chat.repeat_penalty,
            seed=chat.seed,
            stop=tuple(chat.stop),
            ignore_eos=chat.ignore_eos,
        )

    def _tokenize(self, chat: Chat) -> Prompt:
        """Chat template (or transcript), then tokens; runs in a worker thread."""
        messages = [(m.role, m.content) for m in chat.messages]
        model = self.model
        r = render_chat(messages, model.chat_format, self.runner.apply_chat_template,
                        model.system_prompt)  # fmt: skip
        tokens = self.runner.tokenize(r.text)
        # the system prompt's tokens as the prompt has them (a word may straddle the boundary)
        system = self._system_tokens(r.text[: r.system_chars]) if r.system_chars else []
        return Prompt(tokens, r.stops, common_prefix(system, tokens), r.is_default_system)

    def _open(self, conn: Connection, client_id: str) -> Request:
        request = Request(f"{conn.num}:{client_id}", client_id, conn)
        conn.requests[client_id] = request
        self.requests[request.engine_id] = request
        self._count(conn.user, waiting=+1, inflight=+1)
        return request

    def _close(self, request: Request) -> None:
        conn = request.conn
        conn.requests.pop(request.client_id, None)
        self.requests.pop(request.engine_id, None)
        self._count(conn.user, waiting=-1 if request.is_waiting else 0, inflight=-1)

    def _count(self, user: str, waiting: int, inflight: int) -> None:
        c = self.counts
        c.waiting += waiting
        c.waiting_per_user[user] = c.waiting_per_user.get(user, 0) + waiting
        c.inflight_per_user[user] = c.inflight_per_user.get(user, 0) + inflight
        for table in (c.waiting_per_user, c.inflight_per_user):
            if not table[user]:
                del table[user]

    # --- engine events --------------------------------------------------------------------------

    def _on_engine_events(self, events: list[Event]) -> None:
        """Called on the engine thread: hand over to the loop."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._dispatch, events)

    def _dispatch(self, events: list[Event]) -> None:
        for event in events:
            request = self.requests.get(event.request_id)
            if request is None:
                continue
            conn = request.conn
            if isinstance(event, Token):
                if event.text:
                    conn.send_text(request.client_id, event.text)
            elif isinstance(event, Done):
                self._finish(request, event)
            elif isinstance(event, Admitted) and request.is_waiting:
                self._count(conn.user, waiting=-1, inflight=0)
                request.is_waiting = False
            elif isinstance(event, Preempted):
                conn.send(Queued(request.client_id, self.counts.waiting + 1))

    def _finish(self, request: Request, done: Done) -> None:
        self._close(request)
        if done.finish_reason == "error":
            log.error("request %s failed in the engine: %s", request.engine_id, done.error)
            request.conn.error("internal", done.error or "engine error", request.client_id)
        usage = Usage(done.prompt_tokens, done.completion_tokens, done.cached_tokens)
        t = done.timings
        timings = Timings(t["queue_ms"], t["ttft_ms"], t["itl_ms"], t["e2e_ms"])
        request.conn.send(Finished(request.client_id, done.finish_reason, usage, timings))

    # --- HTTP -------------------------------------------------------------------------------

    async def _process_request(self, connection: ServerConnection, request):
        path = request.path.split("?", 1)[0]
        if path == "/healthz":
            snap = await self.snapshot()
            body = json.dumps({"ok": not self.is_shutting_down, "model": snap.model.model,
                               "running": snap.running, "waiting": snap.waiting})  # fmt: skip
            status = HTTPStatus.SERVICE_UNAVAILABLE if self.is_shutting_down else HTTPStatus.OK
            return _response(connection, body, "application/json", status)
        if path == "/metrics":
            text = prometheus.render(await self.snapshot())
            return _response(connection, text, "text/plain; version=0.0.4; charset=utf-8",
                             HTTPStatus.OK)  # fmt: skip
        return None


def _response(connection: ServerConnection, body: str, content_type: str, status: HTTPStatus):
    response = connection.respond(status, body)
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = content_type
    return response


# --- `localserve serve` ---------------------------------------------------------------------


async def run(server: Server, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM, then shut down gracefully."""
    await server.start(host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"localserve: serving {server.runner.info.model} on ws://{host}:{server.port} "
          "(Ctrl-C stops)", flush=True)  # fmt: skip
    await stop.wait()
    print("localserve: shutting down", flush=True)
    await server.shutdown()


class ServerThread:
    """A Server on its own event-loop thread: for the demo and for tests."""

    def __init__(self, server: Server, host: str = "127.0.0.1", port: int = 0) -> None:
        import threading

        self.server = server
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="localserve-server",
                                        daemon=True)  # fmt: skip
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
