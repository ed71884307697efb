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
import math
import os
import signal
import socket
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import NamedTuple

import msgspec
from websockets.asyncio.server import Server as WsServer
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from localserve import __version__, prometheus
from localserve.auth import Access, AuthThrottle, address_group, check_user_name
from localserve.config import ModelConfig, ServerConfig
from localserve.engine import Admitted, Done, Engine, Event, Preempted, Token
from localserve.kv import common_prefix
from localserve.prompt import MAX_CACHED_SYSTEM_CHARS, render_chat
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
MAX_ERRORS_BEFORE_HELLO = 3  # then the connection is closed: no guessing, no free echo service
MAX_OUTBOX_FRAMES = 1024  # a client that stops reading is disconnected, not buffered forever
MAX_ERROR_CHARS = 200  # an error message quotes at most this much of what the client sent
MIN_STATS_INTERVAL_MS = 50
# websockets closes the socket (1009) on frames beyond max_frame_bytes + this; below it we
# answer with an error frame. It also bounds what one connection's reader can hold.
FRAME_SLACK_BYTES = 64 << 10
MAX_QUEUED_FRAMES = 2  # frames read ahead of the one being handled, then TCP pushes back
SOCKET_BUFFER_BYTES = 256 << 10  # the kernel's send buffer (Linux doubles it: 512 KiB)
# the receive buffer, smaller: it bounds how much one read (one callback of the loop) parses
SOCKET_RECEIVE_BYTES = 32 << 10
FRAME_COST_BYTES = 1024  # each frame read (pings too) is charged at least this to the rate
CLOSE_TIMEOUT_S = 2.0  # a closing handshake the client does not finish is cut off
HELLO_TIMEOUT_S = 10.0  # a connection that neither says hello nor subscribes is closed
SNAPSHOT_TIMEOUT_S = 30.0  # an engine that gives no snapshot in this long has a problem
PROBE_CHARS_PER_TOKEN = 8  # a prompt this many chars a token long is probed before tokenizing
TOKENIZER_THREADS = 2  # chats are rendered and tokenized here, never on the event loop
TOKENIZER_NICENESS = 19  # ... at the lowest priority: llama.cpp's threads come first
CLOSE_NOT_READING = 1008  # policy violation: it stopped reading, or too many errors

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


_TOKEN_FRAME_BYTES = len(_encoder.encode(TokenDelta("", "")))  # without its id and text


class _Text:
    """A token frame still open for more text, and the bytes counted for it."""

    __slots__ = ("frame", "num_bytes")

    def __init__(self, frame: TokenDelta, num_bytes: int) -> None:
        self.frame = frame
        self.num_bytes = num_bytes


class _Slot:
    """An encoded frame that a newer one may replace while it waits (stats)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class Outbox:
    """Frames waiting to be written, counted in frames and in bytes.

    Frames are encoded when they are queued, so `num_bytes` is what they hold. Token text for
    a request is merged into one waiting frame; only the newest stats frame is kept.
    """

    def __init__(self) -> None:
        self._frames: deque[bytes | _Text | _Slot] = deque()
        self._open_text: dict[str, _Text] = {}
        self._stats: _Slot | None = None
        self._ready = asyncio.Event()
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._frames)

    def put(self, frame) -> None:
        data = _encoder.encode(frame)
        self._push(data, len(data))

    def put_text(self, client_id: str, text: str) -> None:
        size = len(_encoder.encode(text)) - 2  # as JSON (escapes included), less the quotes
        pending = self._open_text.get(client_id)
        if pending is not None:  # coalesce: the client has not read the last delta yet
            pending.frame.text += text
            pending.num_bytes += size
            self.num_bytes += size
            return
        frame = TokenDelta(client_id, text)
        size += _TOKEN_FRAME_BYTES + len(client_id.encode())
        self._open_text[client_id] = pending = _Text(frame, size)
        self._push(pending, size)

    def put_stats(self, data: bytes) -> None:
        """An encoded stats frame; only the newest snapshot is worth sending."""
        if self._stats is None:
            self._stats = _Slot(data)
            self._push(self._stats, len(data))
        else:
            self.num_bytes += len(data) - len(self._stats.data)
            self._stats.data = data

    def _push(self, item: bytes | _Text | _Slot, num_bytes: int) -> None:
        self._frames.append(item)
        self.num_bytes += num_bytes
        self._ready.set()

    async def get(self) -> bytes:
        while not self._frames:
            self._ready.clear()
            await self._ready.wait()
        item = self._frames.popleft()
        if isinstance(item, _Text):
            del self._open_text[item.frame.id]
            self.num_bytes -= item.num_bytes
            return _encoder.encode(item.frame)
        if isinstance(item, _Slot):
            self._stats = None
            item = item.data
        self.num_bytes -= len(item)
        return item

    @property
    def is_empty(self) -> bool:
        return not self._frames


class Connection:
    """One websocket: its user, its requests, its outbox."""

    def __init__(self, server: Server, ws: ServerConnection, num: int) -> None:
        self.server = server
        self.ws = ws
        self.num = num
        self.address = _address(ws)
        self.user: str | None = None
        self.requests: dict[str, Request] = {}  # by the client's id
        self.outbox = Outbox()
        self.is_closed = False  # nothing more is sent
        self.is_closing = False  # nothing more is read
        self.num_errors_before_hello = 0
        self._stats_task: asyncio.Task | None = None
        self._close_task: asyncio.Future | None = None

    async def run(self) -> None:
        tasks = [asyncio.create_task(c) for c in (self._write(), self._keepalive(), self._greet())]
        try:
            async for message in self.ws:
                if self.is_closing:
                    break
                await self._guarded(message)
        except ConnectionClosed:
            pass
        finally:
            if self._close_task is not None:  # the close code the server chose goes out first
                with contextlib.suppress(Exception):
                    await self._close_task
            self.is_closed = self.is_closing = True
            for task in tasks:
                task.cancel()
            if self._stats_task:
                self._stats_task.cancel()
            self.server.drop(self)

    async def _guarded(self, message: str | bytes) -> None:
        """Handle a frame; whatever goes wrong is an `internal` error, never a dead connection."""
        try:
            await self.handle(message)
        except Exception:
            log.exception("connection %d (%s): handling a frame failed", self.num, self.user)
            self.error("internal", "the server failed to handle this frame (logged)")

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
        """An error frame; it quotes at most MAX_ERROR_CHARS of the client's input."""
        if len(message) > MAX_ERROR_CHARS:
            message = message[:MAX_ERROR_CHARS] + "…"
        if client_id is not None and not 0 < len(client_id) <= MAX_ID_LENGTH:
            client_id = None  # never echo an id the server would not accept
        self.send(Error(code, message, client_id))
        if self.user is None:
            self.num_errors_before_hello += 1
            if self.num_errors_before_hello >= MAX_ERRORS_BEFORE_HELLO:
                self.close(CLOSE_NOT_READING, "too many errors before hello", flush=True)

    def _check_backlog(self) -> None:
        outbox, limit = self.outbox, self.server.config.max_outbox_bytes
        if len(outbox) > MAX_OUTBOX_FRAMES:
            self.close(CLOSE_NOT_READING, f"not reading: over {MAX_OUTBOX_FRAMES} frames unsent")
        elif outbox.num_bytes > limit:
            self.close(CLOSE_NOT_READING, f"not reading: over {limit} bytes unsent")

    def close(self, code: int, reason: str, flush: bool = False) -> None:
        """Close now: requests are cancelled at once, the socket within CLOSE_TIMEOUT_S."""
        if self.is_closing:
            return
        self.is_closing = True
        log.warning("connection %d (%s, %s): closing, %d: %s",
                    self.num, self.user, self.address, code, reason)  # fmt: skip
        if not flush:
            self.is_closed = True
            self.server.drop(self)  # their cells are freed at the next step
        self._close_task = asyncio.ensure_future(self._close(code, reason, flush))

    async def _close(self, code: int, reason: str, flush: bool) -> None:
        if flush:  # let the client read why (errors before hello), briefly
            await self.flush(CLOSE_TIMEOUT_S / 2)
            self.is_closed = True
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.ws.close(code, reason)
        except TimeoutError:
            self.ws.transport.abort()  # it reads nothing, not even the close frame

    async def _write(self) -> None:
        timeout = self.server.config.write_timeout_s
        with contextlib.suppress(ConnectionClosed):
            while True:
                data = await self.outbox.get()
                try:
                    async with asyncio.timeout(timeout):
                        await self.ws.send(data, text=True)
                except TimeoutError:
                    return self.close(CLOSE_NOT_READING, f"not reading for {timeout:g} s")

    async def _greet(self) -> None:
        """Close a connection that is neither a user's nor a monitor's (it holds a slot)."""
        await asyncio.sleep(HELLO_TIMEOUT_S)
        if self.user is None and self._stats_task is None:
            self.close(CLOSE_NOT_READING, f"no hello within {HELLO_TIMEOUT_S:g} s")

    async def _keepalive(self) -> None:
        """A ping every keepalive_s; no pong within keepalive_s closes the connection (1008)."""
        interval = self.server.config.keepalive_s
        with contextlib.suppress(ConnectionClosed):
            while True:
                await asyncio.sleep(interval)
                try:
                    async with asyncio.timeout(interval):
                        await (await self.ws.ping())
                except TimeoutError:
                    if self.ws.is_reading_paused:
                        continue  # the server is not reading it: its pong may be waiting
                    return self.close(CLOSE_NOT_READING, f"no pong within {interval:g} s")

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
        except RecursionError:
            return self.error("bad_request", "invalid frame: JSON nested too deeply")
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
        allowed = self.server.access.allows_user(hello.user, hello.token)
        # unknown names share one key: inventing names must not push real users' entries out
        known = hello.user in self.server.access.users
        credential = f"user {hello.user}" if known else "unknown user"
        refused = self.server.authenticate(self.address, credential, allowed,
                                           "unknown user or wrong token")  # fmt: skip
        if refused:
            return self.error("unauthorized", refused.message)
        self.user = hello.user
        self.send(self.server.welcome())

    def _subscribe(self, sub: Subscribe) -> None:
        allowed = self.server.access.allows_monitor(sub.token)
        refused = self.server.authenticate(self.address, "monitor", allowed,
                                           "stats need the server's monitor token")  # fmt: skip
        if refused:  # an existing subscription goes on
            return self.error("unauthorized", refused.message)
        if self._stats_task:
            self._stats_task.cancel()
            self._stats_task = None
        if sub.interval_ms > 0:
            interval = max(sub.interval_ms, MIN_STATS_INTERVAL_MS) / 1e3
            self._stats_task = asyncio.create_task(self._stream_stats(interval))

    async def _stream_stats(self, interval_s: float) -> None:
        while not self.is_closed:
            try:
                self.outbox.put_stats(await self.server.stats_frame())
            except Exception:  # the engine failed a snapshot: try again at the next tick
                log.exception("connection %d: no stats this time", self.num)
            self._check_backlog()
            await asyncio.sleep(interval_s)

    def _cancel(self, cancel: Cancel) -> None:
        if len(cancel.id) > MAX_ID_LENGTH:
            return self.error("bad_request", f"id: 1-{MAX_ID_LENGTH} characters")
        request = self.requests.get(cancel.id)
        if request is None:  # also the answer for another connection's ids: nothing leaks
            return self.error("unknown_id", f"no request {cancel.id!r} in flight here", cancel.id)
        self.server.engine.cancel(request.engine_id)


def _lower_priority() -> None:
    """Run this (tokenizer) thread at the lowest CPU priority.

    llama.cpp's threads meet at a barrier after every operation: a thread that loses its core
    to other work stalls the whole step. With two cores and two llama.cpp threads, tokenizing a
    pasted 250 KB prompt at normal priority stretched decode steps from 11 ms to over a second;
    at this priority they stay under 35 ms (benchmarks/issue10_hostile.py).
    """
    with contextlib.suppress(OSError, AttributeError):  # Linux: per thread; elsewhere: as is
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), TOKENIZER_NICENESS)


def _address(ws: ServerConnection) -> str:
    """The client's IP address (the throttle's key)."""
    peer = ws.remote_address
    return str(peer[0]) if peer else "unknown"


def _recover_id(message: str) -> str | None:
    """The `id` of a frame that failed validation, so the error can name the request."""
    try:
        found = msgspec.json.decode(message, type=_IdOnly)
    except (msgspec.DecodeError, RecursionError):
        return None
    return found.id


@dataclass
class _Counts:
    waiting: int = 0
    waiting_per_user: dict[str, int] = field(default_factory=dict)
    inflight_per_user: dict[str, int] = field(default_factory=dict)


class PromptTooLong(ValueError):
    """The formatted prompt does not fit in the context."""


class Refused(NamedTuple):
    message: str
    retry_after_s: float  # > 0: the throttle refused, whatever the token


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
        self.throttle = AuthThrottle(config.max_auth_failures_per_minute)
        self.is_shutting_down = False
        self.port = 0
        self._numbers = itertools.count(1)
        self._snapshot: asyncio.Future[Snapshot] | None = None  # on its way from the engine
        self._stats_frame: tuple[Snapshot | None, bytes] = (None, b"")
        self._tokenizer = ThreadPoolExecutor(
            TOKENIZER_THREADS, "localserve-tokenize", initializer=_lower_priority
        )
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
            create_connection=functools.partial(
                _GuardedConnection,
                max_write_buffer=self.config.max_outbox_bytes + (64 << 10),
                max_read_rate=self.config.max_frame_bytes + FRAME_SLACK_BYTES,
            ),
            max_size=self.config.max_frame_bytes + FRAME_SLACK_BYTES,
            max_queue=MAX_QUEUED_FRAMES,
            ping_interval=None,  # each Connection pings itself: no pong is a 1008, not a 1011
            compression=None,  # a deflated frame can grow ~1000x: no bound would hold
            close_timeout=CLOSE_TIMEOUT_S,
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
        self._tokenizer.shutdown(wait=False, cancel_futures=True)

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
        """A closed connection: cancel its requests (their cells are freed at the next step).

        Called when it is closed, and again when its handler ends: cancelling twice is harmless.
        """
        self.connections.discard(conn)
        for request in conn.requests.values():
            self.engine.cancel(request.engine_id)

    def authenticate(
        self, address: str, credential: str, allowed: bool, refusal: str
    ) -> Refused | None:
        """None when a token check passed; else why not (its refusal, or the throttle's).

        Failures count per (address, credential): guessing bob's token from one place locks
        only that, for a minute; other users and other places sign in as usual.
        """
        key = f"{address_group(address)} {credential}"
        wait = self.throttle.retry_after(key)
        if wait > 0:
            message = f"too many failed attempts from your address; try again in {wait:.0f} s"
            return Refused(message, wait)
        if allowed:
            return None
        self.throttle.failed(key)
        log.warning("%s: %s (%s)", address, refusal, credential[:80])
        return Refused(refusal, 0.0)

    def welcome(self) -> Welcome:
        c = self.config
        limits = Limits(c.max_frame_bytes, c.max_tokens, c.max_inflight_per_user,
                        c.max_queued_per_user, c.max_queued)  # fmt: skip
        return Welcome(self.runner.info.model, self.runner.info.n_ctx, limits, __version__)

    async def snapshot(self) -> Snapshot:
        """The engine's next snapshot; askers who come while one is on its way share it, so
        any number of monitors cost the engine at most one snapshot per step."""
        if self._snapshot is None:
            self._snapshot = asyncio.ensure_future(self._fetch_snapshot())
        return await asyncio.shield(self._snapshot)  # one asker giving up cancels nothing

    async def _fetch_snapshot(self) -> Snapshot:
        try:
            async with asyncio.timeout(SNAPSHOT_TIMEOUT_S):  # a stuck engine must not hang us
                return await asyncio.wrap_future(self.engine.snapshot())
        finally:
            self._snapshot = None

    async def stats_frame(self) -> bytes:
        """The encoded stats frame of the latest snapshot (encoded once for every monitor)."""
        snap = await self.snapshot()
        if self._stats_frame[0] is not snap:
            self._stats_frame = (snap, _encoder.encode(Stats(snap)))
        return self._stats_frame[1]

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
            loop = asyncio.get_running_loop()
            prompt = await loop.run_in_executor(self._tokenizer, self._tokenize, chat)
            if not chat.ignore_eos:  # the format's end of turn is an EOS in all but name
                params = msgspec.structs.replace(params, format_stop=prompt.stops)
            if conn.is_closed or self.is_shutting_down:  # both may have come while tokenizing
                self._close(request)
                if self.is_shutting_down:
                    conn.error("shutting_down", "the server is shutting down", chat.id)
                return None
            self.engine.add_request(
                request.engine_id, prompt.tokens, params, user=conn.user,
                shared_prefix_tokens=prompt.system_tokens,
                share_globally=prompt.is_default_system,
            )  # fmt: skip
        except PromptTooLong as e:
            self._close(request)
            self.engine.reject()
            return conn.error("too_long", str(e), chat.id)
        except ValueError as e:
            self._close(request)
            return conn.error("bad_request", str(e), chat.id)
        except BaseException:  # unexpected (or cancelled): the request must not stay counted
            self._close(request)
            raise
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
        """Chat template (or transcript), then tokens; runs in a tokenizer thread.

        Raises PromptTooLong (the one too-long check) and ValueError (a bad chat).
        """
        messages = [(m.role, m.content) for m in chat.messages]
        model, n_ctx, tokenize = self.model, self.runner.info.n_ctx, self.runner.tokenize
        r = render_chat(messages, model.chat_format, self.runner.apply_chat_template,
                        model.system_prompt)  # fmt: skip
        probe = n_ctx * PROBE_CHARS_PER_TOKEN
        if len(r.text) > probe and len(head := tokenize(r.text[:probe])) > n_ctx:
            # far too long: no need to tokenize all of it (up to max_frame_bytes) to say so
            raise PromptTooLong(
                f"the prompt has over {len(head)} tokens; the context holds {n_ctx}"
            )
        tokens = tokenize(r.text)
        if len(tokens) >= n_ctx:
            raise PromptTooLong(f"the prompt has {len(tokens)} tokens; the context holds {n_ctx}")
        # the system prompt's tokens as the prompt has them (a word may straddle the boundary)
        system_text = r.text[: r.system_chars]
        cached = len(system_text) <= MAX_CACHED_SYSTEM_CHARS  # the cache is bounded in bytes
        system = (self._system_tokens if cached else tokenize)(system_text) if system_text else []
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
            if request is not None:
                try:
                    self._route(request, event)
                except Exception:  # one request's trouble must not drop others' events
                    log.exception("request %s: routing %s failed", request.engine_id, event)

    def _route(self, request: Request, event: Event) -> None:
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
            refused = self._check_metrics_token(connection, request)
            if refused is not None:
                return refused
            t = self.throttle
            text = prometheus.render(await self.snapshot(), t.num_failures, t.num_throttled)
            return _response(connection, text, "text/plain; version=0.0.4; charset=utf-8",
                             HTTPStatus.OK)  # fmt: skip
        if len(self.connections) >= self.config.max_connections:
            return _response(connection, "too many connections; try again later\n",
                             "text/plain", HTTPStatus.SERVICE_UNAVAILABLE)  # fmt: skip
        return None  # a websocket

    def _check_metrics_token(self, connection: ServerConnection, request):
        """/metrics follows the stats rule; the monitor token comes as a Bearer token."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        allowed = self.access.allows_monitor(token.strip() if scheme.lower() == "bearer" else None)
        refused = self.authenticate(_address(connection), "monitor", allowed,
                                    "/metrics needs the monitor token (Bearer)")  # fmt: skip
        if refused is None:
            return None
        if refused.retry_after_s:
            response = _response(connection, refused.message + "\n", "text/plain",
                                 HTTPStatus.TOO_MANY_REQUESTS)  # fmt: skip
            response.headers["Retry-After"] = str(math.ceil(refused.retry_after_s))
            return response
        response = _response(connection, refused.message + "\n", "text/plain",
                             HTTPStatus.UNAUTHORIZED)  # fmt: skip
        response.headers["WWW-Authenticate"] = 'Bearer realm="localserve"'
        return response


class _GuardedConnection(ServerConnection):
    """A websocket connection with bounded buffers and GET as the only HTTP method.

    The kernel's send and receive buffers are capped (Linux otherwise grows a send buffer to
    4 MiB for a client that does not read), and so is the transport's write buffer. Every
    method but GET is answered 405 before websockets parses the request: it would pass methods
    without a body to process_request, and close the connection without an answer on a request
    with a body.
    """

    _head: bytes | None = b""  # the request's first bytes, until its method is known

    def __init__(self, *args, max_write_buffer: int, max_read_rate: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.max_write_buffer = max_write_buffer
        # a token bucket over bytes read: a burst of two frames, then max_read_rate a second
        self.max_read_rate = max_read_rate
        self._credit = self._burst = 2 * max_read_rate
        self._credit_time = 0.0
        self._is_rate_paused = False

    def connection_made(self, transport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_RECEIVE_BYTES)
        super().connection_made(transport)
        self.recv_messages.resume = self._resume_reading  # its flow control, and the rate's

    def data_received(self, data: bytes) -> None:
        if self._head is not None:
            self._head += data
            method, space, _ = self._head.partition(b" ")
            if not space and len(self._head) < 16:
                return  # wait for the whole method
            data, self._head = self._head, None
            if method != b"GET":
                body = b"only GET: /healthz, /metrics, or a websocket\n"
                self.transport.write(
                    b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET\r\nConnection: close\r\n"
                    b"Content-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                self.transport.close()
                return
        super().data_received(data)
        # websockets answers each ping with a pong written at once, with no flow control: a
        # client that sends pings and reads nothing would grow this buffer without bound
        if self.transport.get_write_buffer_size() > self.max_write_buffer:
            log.warning("%s: not reading its pongs; connection cut", _address(self))
            self.transport.abort()
        else:
            self._limit_read_rate(len(data))

    def process_event(self, event) -> None:
        """Each frame costs the loop work (a pong, a decode), however few bytes it has."""
        if self.request is not None:  # a frame, not the handshake
            self._charge(FRAME_COST_BYTES)
        super().process_event(event)

    def _limit_read_rate(self, num_bytes: int) -> None:
        """Stop reading for a while when a client sends faster than max_read_rate.

        Every byte costs the event loop (frames decoded, pings answered) and, on a small
        machine, the CPU that llama.cpp's threads need: one flooding client must not take it.
        """
        self._charge(num_bytes)
        if self._credit < 0 and not self._is_rate_paused:
            self._is_rate_paused = True
            self.transport.pause_reading()
            self.loop.call_later(-self._credit / self.max_read_rate, self._end_rate_pause)

    def _charge(self, num_bytes: int) -> None:
        now = self.loop.time()
        elapsed, self._credit_time = now - self._credit_time, now
        self._credit = min(self._burst, self._credit + elapsed * self.max_read_rate) - num_bytes

    def _end_rate_pause(self) -> None:
        self._is_rate_paused = False
        self._resume_reading()

    @property
    def is_reading_paused(self) -> bool:
        """The server holds reading back (the rate, or websockets' own flow control)."""
        return self._is_rate_paused or self.recv_messages.paused

    def _resume_reading(self) -> None:
        """Read again once neither the rate nor websockets' own flow control holds it back."""
        if not (self.is_reading_paused or self.transport.is_closing()):
            self.transport.resume_reading()


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
