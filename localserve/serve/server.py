"""The server: connections and HTTP requests on one side, the engine on the other.

One port, served by uvicorn (transport.py bounds every connection): websockets speak localserve's
protocol (connection.py), `GET /healthz` and `GET /metrics` answer operators, and `/v1` is the
OpenAI-compatible API (openai_api.py). Every chat, whichever way it came, passes the same
admission here (`submit`): per-user and global bounds, the prompt builder's too-long check, then
the engine. Engine events come back through `call_soon_threadsafe` and are routed to the sink
that owns the request (a websocket connection or an HTTP stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import math
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from localserve import __version__
from localserve.config import ModelConfig, ServerConfig
from localserve.engine.client import EngineUnavailable
from localserve.engine.engine import Engine
from localserve.engine.events import Admitted, Done, Event, Preempted, Token
from localserve.engine.runner import Runner
from localserve.engine.sampling_params import SamplingParams, sampling_params
from localserve.ops import prometheus
from localserve.ops.auth import Access, AuthThrottle, address_group, browser_refusal
from localserve.ops.usage import Row, Usage
from localserve.protocol.frames import Limits, Notice, SamplingFields, Stats, Welcome
from localserve.protocol.snapshot import Snapshot
from localserve.serve import page
from localserve.serve.admission import RETRY_UNAVAILABLE_S, Refusal, Request, Sink
from localserve.serve.openai import api as openai_api
from localserve.serve.prompt import Prompt, PromptBuilder, PromptTooLong
from localserve.serve.transport import GuardedHTTP, GuardedWebSocket
from localserve.serve.transport import Limits as ConnectionLimits
from localserve.serve.websocket.connection import CLOSE_GOING_AWAY, Connection, client_address

log = logging.getLogger("localserve.serve.server")

# websockets closes the socket (1009) on frames beyond max_frame_bytes + this; below it we
# answer with an error frame. It also bounds what one connection's reader can hold.
FRAME_SLACK_BYTES = 64 << 10
SNAPSHOT_TIMEOUT_S = 30.0  # an engine that gives no snapshot in this long has a problem
HEALTH_TIMEOUT_S = 2.0  # /healthz answers within this long, whatever the engine does
# A `done` waits this long for its usage row to be committed, then goes out saying it was not
# (at once while the record is known to be broken): a reply never hangs on a dead disk.
RECORD_WAIT_S = 3.0
KEEP_ALIVE_S = 5.0  # an idle HTTP connection is closed after this long
RETRY_FULL_S = 5  # Retry-After of the 503 for a websocket beyond max_connections

_encoder = msgspec.json.Encoder()


class Refused(NamedTuple):
    message: str
    retry_after_s: float  # > 0: the throttle refused, whatever the token


@dataclass
class _Counts:
    waiting: int = 0
    waiting_per_user: dict[str, int] = field(default_factory=dict)
    inflight_per_user: dict[str, int] = field(default_factory=dict)


class Server:
    """Wires the engine, the prompt builder, the websocket protocol and the HTTP API."""

    def __init__(
        self,
        engine: Engine,
        runner: Runner,
        model: ModelConfig,
        config: ServerConfig,
        access: Access,
        usage: Usage | None = None,
    ) -> None:
        self.engine = engine
        self.usage = usage  # the record of finished requests, quotas, the access log
        self._done_waiting = 0  # `done`s waiting for their usage row to be committed
        self.runner = runner
        self.model = model
        self.model_name = runner.info.model
        self.config = config
        self.access = access
        self.requests: dict[str, Request] = {}  # by engine id
        self.connections: set[Connection] = set()
        self.counts = _Counts()
        self.throttle = AuthThrottle(config.max_auth_failures_per_minute)
        self.prompts = PromptBuilder(
            runner.tokenize,
            runner.apply_chat_template,
            runner.info.n_ctx,
            model.chat_format,
            model.system_prompt,
        )
        self.is_shutting_down = False
        self.port = 0
        self.numbers = itertools.count(1)  # connections and HTTP requests
        self._snapshot: asyncio.Future[Snapshot] | None = None  # on its way from the engine
        self._latest: Snapshot | None = None  # the last one that came
        # the latest stats frame, encoded, and what it was built from (snapshot, usage version)
        self._stats_frame: tuple[Snapshot | None, tuple[int, str], bytes] = (None, (0, ""), b"")
        self._uvicorn: uvicorn.Server | None = None
        self.limits: ConnectionLimits | None = None  # and the sockets open, once started
        self._ticker: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.http = self._http_app()
        engine.on_events = self._on_engine_events

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> None:
        self._loop = asyncio.get_running_loop()
        c = self.config
        self.limits = limits = ConnectionLimits(lambda: self.config, FRAME_SLACK_BYTES)
        config = uvicorn.Config(
            self.asgi,
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
            # sockets are capped per place and in all by transport.Limits, websockets by
            # max_connections here (uvicorn's own cap would refuse /healthz with the rest)
            limit_concurrency=None,
            timeout_graceful_shutdown=5,
        )
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
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

    async def shutdown(self) -> None:
        """Stop admitting, tell clients, let replies finish within the grace period, close."""
        if self.is_shutting_down:
            return
        self.is_shutting_down = True
        grace = self.config.shutdown_grace_s
        log.info("shutting down: %d requests in flight, %.0f s grace", len(self.requests), grace)
        notice = Notice("shutting_down", f"server stopping; replies in flight get {grace:g} s")
        for conn in list(self.connections):
            conn.send(notice)
        await self._wait_for_requests(grace)
        for request in list(self.requests.values()):
            self.engine.cancel(request.engine_id)
        await self._wait_for_requests(5.0)
        with contextlib.suppress(TimeoutError):  # every `done` out: its row committed first
            async with asyncio.timeout(10.0):
                while self._done_waiting:
                    await asyncio.sleep(0.01)
        await asyncio.gather(*(c.flush(1.0) for c in self.connections))
        for conn in list(self.connections):
            conn.close(CLOSE_GOING_AWAY, "server shutting down")
        await asyncio.sleep(0.05)  # the close frames go out
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            await self._uvicorn.shutdown()
        if self._ticker is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._ticker
        self.prompts.shutdown()

    async def _wait_for_requests(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            async with asyncio.timeout(timeout):
                while self.requests:
                    await asyncio.sleep(0.02)

    # --- ASGI: websockets here, HTTP to Starlette ------------------------------------------------

    async def asgi(self, scope, receive, send) -> None:
        if scope["type"] == "websocket":
            return await self._websocket(scope, receive, send)
        if refusal := self._browser_refusal(scope):
            return await PlainTextResponse(refusal + "\n", 403)(scope, receive, send)
        await self.http(scope, receive, send)

    def _browser_refusal(self, scope) -> str | None:
        c = self.config
        refusal = browser_refusal(scope["headers"], c.allowed_origins, c.allowed_hosts)
        if refusal is not None:
            log.warning("%s: %s", client_address(scope), refusal)
        return refusal

    async def _websocket(self, scope, receive, send) -> None:
        if refusal := self._browser_refusal(scope):
            return await _deny(send, 403, refusal + "\n")
        if self.is_full:
            return await _deny(send, 503, "too many connections; try again later\n", RETRY_FULL_S)
        conn = Connection(self, scope, receive, send, next(self.numbers))
        self.connections.add(conn)
        await conn.run()

    @property
    def is_full(self) -> bool:
        """max_connections users and monitors are connected.

        One that has said no hello counts for none: the socket caps bound those, and one
        place's silent sockets must not keep everyone else out (transport.Limits).
        """
        return sum(not c.is_silent for c in self.connections) >= self.config.max_connections

    def drop(self, conn: Connection) -> None:
        """A closed connection: cancel its requests (their cells are freed at the next step).

        Called when it is closed, and again when its handler ends: cancelling twice is harmless.
        """
        self.connections.discard(conn)
        for request in conn.requests.values():
            self.engine.cancel(request.engine_id)

    def _http_app(self) -> Starlette:
        routes = [
            Route("/healthz", self._healthz),
            Route("/metrics", self._metrics),
            *page.routes(),
            *openai_api.routes(self),
        ]
        return Starlette(routes=routes, exception_handlers=openai_api.exception_handlers())

    async def _healthz(self, request: HttpRequest) -> Response:
        """Load in totals only (no user's requests): open to anyone, the chat page's status.
        Within HEALTH_TIMEOUT_S whatever the engine does: an engine that does not answer in
        that long is a problem, said with the last snapshot that came."""
        late = ""
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                snap = await self.snapshot()
        except TimeoutError:
            snap = self._latest
            late = f"the engine has not answered for {HEALTH_TIMEOUT_S:g} s"
        usage_problem = self.usage.problem if self.usage is not None else ""
        problems = [p for p in (late, snap and snap.engine_problem, usage_problem) if p]
        if self.is_shutting_down:
            problems.insert(0, "shutting down")
        info = self.runner.info
        body = {
            "ok": not problems,
            "model": info.model,
            "backend": info.backend,
            "tokens": self.access.requires_tokens,
        }
        if snap is not None:
            body |= {
                "running": snap.running,
                "waiting": snap.waiting,
                "max_running": snap.max_num_seqs,
                "kv_used": snap.kv_used,
                "kv_cached": snap.kv_cached,
                "kv_total": snap.kv_total,
            }
        if problems or (snap is not None and snap.workers):  # what is wrong; each worker
            body["problem"] = "; ".join(problems)
            body["workers"] = [msgspec.structs.asdict(w) for w in snap.workers] if snap else []
        if usage_problem:  # rows kept in memory, not on disk
            body["usage_problem"] = usage_problem
            body["usage_unwritten"] = self.usage.num_unwritten
        headers = {"Retry-After": "5"} if problems else None
        return JSONResponse(body, 503 if problems else 200, headers)

    async def _metrics(self, request: HttpRequest) -> Response:
        """/metrics follows the stats rule; the monitor token comes as a Bearer token."""
        allowed = self.access.allows_monitor(openai_api.bearer_token(request))
        refused = self.authenticate(
            client_address(request.scope),
            "monitor",
            allowed,
            "/metrics needs the monitor token (Bearer)",
        )
        if refused is not None:
            if refused.retry_after_s:
                wait = {"Retry-After": str(math.ceil(refused.retry_after_s))}
                return PlainTextResponse(refused.message + "\n", 429, wait)
            challenge = {"WWW-Authenticate": 'Bearer realm="localserve"'}
            return PlainTextResponse(refused.message + "\n", 401, challenge)
        t = self.throttle
        text = prometheus.render(await self.snapshot(), t.num_failures, t.num_throttled)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    # --- identity -------------------------------------------------------------------------------

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

    def welcome(self, user: str) -> Welcome:
        c = self.config
        limits = Limits(
            c.max_frame_bytes,
            c.max_tokens,
            c.max_inflight_per_user,
            c.max_queued_per_user,
            c.max_queued,
        )
        info = self.runner.info
        quota = self.usage.quota(user) if self.usage is not None else None
        return Welcome(
            self.model_name, info.n_ctx, limits, __version__, backend=info.backend, quota=quota
        )

    # --- snapshots ------------------------------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        """The engine's next snapshot; askers who come while one is on its way share it, so
        any number of monitors cost the engine at most one snapshot per step."""
        if self._snapshot is None:
            self._snapshot = asyncio.ensure_future(self._fetch_snapshot())
        return await asyncio.shield(self._snapshot)  # one asker giving up cancels nothing

    async def _fetch_snapshot(self) -> Snapshot:
        try:
            async with asyncio.timeout(SNAPSHOT_TIMEOUT_S):  # a stuck engine must not hang us
                snap = self._latest = await asyncio.wrap_future(self.engine.snapshot())
                return snap
        finally:
            self._snapshot = None

    async def stats_frame(self) -> bytes:
        """The encoded stats frame of the latest snapshot (encoded once for every monitor)."""
        snap = await self.snapshot()
        usage = self.usage
        version = (usage.version, usage.problem) if usage is not None else (0, "")
        built_from, built_version, frame = self._stats_frame
        if built_from is not snap or built_version != version:
            today = usage.today() if usage is not None else []
            frame = _encoder.encode(Stats(snap, today, usage_problem=version[1]))
            self._stats_frame = (snap, version, frame)
        return frame

    # --- admission: every chat, websocket or HTTP -----------------------------------------------

    async def submit(
        self,
        sink: Sink,
        user: str,
        client_id: str,
        engine_id: str,
        fields: SamplingFields,
        prompt: Callable[[], Awaitable[Prompt]],
    ) -> Request | None:
        """Check the limits and the sampling values, build the prompt, hand it to the engine.

        Raises Refusal (busy, shutting_down, too_long, bad_request, quota_exceeded,
        unavailable); returns None when the sink closed while the prompt was being built
        (nothing was queued).
        """
        problem = self._check_admission(user, fields.max_tokens)
        if problem:
            if problem.code in ("busy", "shutting_down", "unavailable"):
                self.engine.reject()
            raise problem
        try:
            params = sampling_params(fields)
        except ValueError as e:
            raise Refusal("bad_request", str(e)) from None
        request = self._open(Request(engine_id, client_id, user, sink))
        allowance = self.usage.allowance(user) if self.usage is not None else None
        if allowance is not None:  # a quota: the reply may use at most what is left of it
            params = msgspec.structs.replace(params, max_tokens=min(params.max_tokens, allowance))
            self._hold(request, params.max_tokens)  # until the prompt's length is known
        try:
            if not await self._enqueue(request, params, fields, allowance is not None, prompt):
                return None
        except EngineUnavailable as e:  # it went down while the prompt was built
            self._close(request)
            raise _unavailable(str(e)) from None
        except PromptTooLong as e:
            self._close(request)
            self.engine.reject()
            raise Refusal("too_long", str(e)) from None
        except Refusal:
            raise
        except ValueError as e:
            self._close(request)
            raise Refusal("bad_request", str(e)) from None
        except BaseException:  # unexpected (or cancelled): the request must not stay counted
            self._close(request)
            raise
        return request

    async def _enqueue(
        self,
        request: Request,
        params: SamplingParams,
        fields: SamplingFields,
        has_quota: bool,
        prompt: Callable[[], Awaitable[Prompt]],
    ) -> bool:
        """Build the prompt and hand the request to the engine; False when its sink closed
        meanwhile (it is closed here: nothing was queued)."""
        built = await prompt()
        if not fields.ignore_eos:  # the format's end of turn is an EOS in all but name
            params = msgspec.structs.replace(params, format_stop=built.stops)
        if request.sink.is_closed or self.is_shutting_down:  # both may come while tokenizing
            self._close(request)
            if self.is_shutting_down:
                raise Refusal("shutting_down", "the server is shutting down")
            return False
        if has_quota:
            params = self._hold_prompt(request, params, len(built.tokens))
        self.engine.add_request(
            request.engine_id,
            built.tokens,
            params,
            user=request.user,
            system_tokens=built.system_tokens,
            system_is_global=built.is_default_system,
            client_id=request.client_id,
        )
        return True

    def _hold(self, request: Request, tokens: int) -> None:
        """Reserve (or, negative, give back) tokens of the user's quota for this request."""
        request.reserved_tokens += tokens
        if tokens > 0:
            self.usage.reserve(request.user, tokens)
        else:
            self.usage.release(request.user, -tokens)

    def _hold_prompt(
        self, request: Request, params: SamplingParams, num_tokens: int
    ) -> SamplingParams:
        """The prompt's tokens count against the quota from now on (all of them: what the cache
        saves is known only at the end, when the row settles it), and the reply may use what is
        left after it: requests in flight at once stay within the quota together."""
        usage, user = self.usage, request.user
        if over := usage.prompt_refusal(user, num_tokens, request.reserved_tokens):
            self._close(request)
            raise Refusal("quota_exceeded", over[0], retry_after_s=over[1])
        left = usage.left(user, request.reserved_tokens)
        max_tokens = min(params.max_tokens, left - num_tokens)
        self._hold(request, num_tokens + max_tokens - params.max_tokens)
        return msgspec.structs.replace(params, max_tokens=max_tokens)

    def _check_admission(self, user: str, max_tokens: int) -> Refusal | None:
        c = self.config
        if self.is_shutting_down:
            return Refusal("shutting_down", "the server is shutting down")
        if problem := self.engine.problem:  # the engine process is down or restarting
            return _unavailable(problem)
        if self.usage is not None and (why := self.usage.record_refusal(user)):
            return Refusal("unavailable", why, retry_after_s=RETRY_UNAVAILABLE_S)
        if self.usage is not None and (over := self.usage.quota_refusal(user)):
            return Refusal("quota_exceeded", over[0], retry_after_s=over[1])
        if max_tokens > c.max_tokens:
            return Refusal("bad_request", f"max_tokens: at most {c.max_tokens} on this server")
        if self.counts.inflight_per_user.get(user, 0) >= c.max_inflight_per_user:
            message = f"{c.max_inflight_per_user} requests of yours are already in flight"
            return Refusal("busy", message, retry_after_s=1)
        if self.counts.waiting_per_user.get(user, 0) >= c.max_queued_per_user:
            message = f"{c.max_queued_per_user} requests of yours are already queued"
            return Refusal("busy", message, retry_after_s=1)
        if self.counts.waiting >= c.max_queued:
            message = f"the queue is full ({c.max_queued} waiting); try again shortly"
            return Refusal("busy", message, retry_after_s=1)
        return None

    def _open(self, request: Request) -> Request:
        self.requests[request.engine_id] = request
        self._count(request.user, waiting=+1, inflight=+1)
        return request

    def _close(self, request: Request) -> None:
        if self.requests.pop(request.engine_id, None) is not None:
            self._count(request.user, waiting=-1 if request.is_waiting else 0, inflight=-1)
            if request.reserved_tokens:
                self.usage.release(request.user, request.reserved_tokens)

    def cancel(self, request: Request) -> None:
        """Cancel at the next step (its cells are freed then); its `done` still comes."""
        self.engine.cancel(request.engine_id)

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
        sink = request.sink
        if isinstance(event, Token):
            if event.text:
                sink.on_token(request, event.text)
        elif isinstance(event, Done):
            self._close(request)
            if event.finish_reason == "error":
                log.error("request %s failed in the engine: %s", request.engine_id, event.error)
            self._record(request, event)
        elif isinstance(event, Admitted) and request.is_waiting:
            self._count(request.user, waiting=-1, inflight=0)
            request.is_waiting = False
        elif isinstance(event, Preempted):
            sink.on_queued(request, self.counts.waiting + 1)

    def _record(self, request: Request, event: Done) -> None:
        """Hand the row to the record; the `done` goes once it is committed, or after
        RECORD_WAIT_S (at once while the record is broken) saying it is not."""
        if self.usage is None:
            return self._deliver_done(request, event, recorded=False)
        loop, is_sent = self._loop, False

        def deliver(recorded: bool) -> None:  # whichever comes first: the commit or the timer
            nonlocal is_sent
            if not is_sent:
                is_sent = True
                timer.cancel()
                self._done_waiting -= 1
                self._deliver_done(request, event, recorded)

        def committed(recorded: bool) -> None:  # on the writer thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
                loop.call_soon_threadsafe(deliver, recorded)

        timer = loop.call_later(0 if self.usage.problem else RECORD_WAIT_S, deliver, False)
        self._done_waiting += 1
        try:
            self.usage.record(self._row(request, event), committed)
        except Exception:  # no record: the reply still ends
            log.exception("request %s: not recorded", request.engine_id)
            deliver(False)

    def _deliver_done(self, request: Request, event: Done, recorded: bool) -> None:
        """The `done`, saying whether its row is committed (on the loop)."""
        request.is_recorded = recorded
        try:
            request.sink.on_done(request, event)
        except Exception:
            log.exception("request %s: sending its done failed", request.engine_id)

    def _row(self, request: Request, event: Done) -> Row:
        t = event.timings
        return Row(
            finished=time.time(),
            user=request.user,
            model=self.model_name,
            request_id=request.engine_id,
            client_id=request.client_id,
            api=getattr(request.sink, "api", "websocket"),
            prompt_tokens=event.prompt_tokens,
            cached_tokens=event.cached_tokens,
            completion_tokens=event.completion_tokens,
            queue_ms=t.get("queue_ms"),
            ttft_ms=t.get("ttft_ms"),
            e2e_ms=t.get("e2e_ms"),
            finish_reason=event.finish_reason,
        )


def _unavailable(problem: str) -> Refusal:
    """The refusal while the engine process is down or reloading, with why."""
    message = f"the model is unavailable: {problem}. Try again shortly"
    return Refusal("unavailable", message, RETRY_UNAVAILABLE_S)


async def _deny(send, status: int, text: str, retry_after_s: int = 0) -> None:
    """Refuse a websocket upgrade with a plain HTTP answer."""
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8")]
    if retry_after_s:
        headers.append((b"retry-after", b"%d" % retry_after_s))
    await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})


# --- `localserve serve` ---------------------------------------------------------------------


async def run(server: Server, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM, then shut down gracefully."""
    await server.start(host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host  # a browser can open it
    if ":" in shown:
        shown = f"[{shown}]"
    print(
        f"localserve: serving {server.model_name} on ws://{host}:{server.port} "
        f"and http://{host}:{server.port}/v1 (Ctrl-C stops)\n"
        f"localserve: chat in a browser at http://{shown}:{server.port}/",
        flush=True,
    )
    await stop.wait()
    print("localserve: shutting down", flush=True)
    await server.shutdown()


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
