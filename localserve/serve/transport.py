"""Bounded connections: uvicorn's HTTP and websocket protocols with localserve's limits.

uvicorn parses HTTP (httptools) and hands websockets to the `websockets` library's Sans-I/O
protocol; these subclasses add what one hostile client must not get past:

- kernel buffers fixed small (Linux grows a send buffer to 4 MiB for a client that does not
  read; the receive buffer bounds how much one read, one callback of the loop, parses);
- a read rate per connection (a token bucket over bytes, each HTTP request and websocket frame
  charged at least FRAME_COST_BYTES): a flooding client must not take the CPU llama.cpp needs;
- HTTP: a request's head within MAX_HEAD_BYTES and HEAD_TIMEOUT_S, at most MAX_PIPELINED
  requests read ahead;
- websockets: a client that does not read the pongs the protocol writes for its pings is cut
  off; no pong within the keepalive closes with 1008 (not while the server itself holds reading
  back); a closing handshake the client does not finish is cut off after CLOSE_TIMEOUT_S; a
  malformed frame closes with the library's code (1007 for invalid UTF-8) and one log line;
- sockets counted per place and in all (`ConnectionLimits`): at a cap, the socket of that
  place idle the longest (no request in progress, or a websocket that has not said hello) is
  closed to make room, so one place's idle or half-open sockets cannot keep anyone else out.

The app reaches its connection's protocol through `scope["extensions"]["localserve"]`, to
abort a connection that stopped reading (a close would wait for its buffer to drain). Who is
on the other end, as every front-end reads it, is here too: `client_address`, `bearer_token`.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable

from starlette.requests import HTTPConnection
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from localserve.config import ServerConfig
from localserve.ops.auth import address_group

log = logging.getLogger("localserve.serve.transport")

SOCKET_SEND_BYTES = 256 << 10  # the kernel's send buffer (Linux doubles it: 512 KiB)
SOCKET_RECEIVE_BYTES = 32 << 10  # smaller: it bounds how much one read parses
FRAME_COST_BYTES = 1024  # each frame or request read (pings too) costs at least this much
MAX_HEAD_BYTES = 64 << 10  # request line and headers
HEAD_TIMEOUT_S = 10.0  # a request's head must arrive within this long
MAX_PIPELINED = 16  # HTTP requests read ahead of the one being answered
# open sockets, HTTP and websocket: max_connections + this from one place (auth.address_group),
# twice that in all. Beyond, each new socket closes the place's longest idle one (idle for
# MIN_IDLE_S at least); twice over, with none to close, a new one is cut at once. Idle ones
# close within HEAD_TIMEOUT_S (websockets HELLO_TIMEOUT_S) anyway.
SOCKET_SLACK = 32
MIN_IDLE_S = 1.0
CLOSE_TIMEOUT_S = 2.0
CLOSE_NOT_READING = 1008  # policy violation
CLOSE_INVALID_DATA = 1007
LOG_INTERVAL_S = 10.0  # one line per place and kind of trouble this often; the rest counted
MAX_LOG_PLACES = 4096  # places remembered for that; the longest quiet forgotten first


class PlaceLog:
    """Log lines about clients, at most one per place and kind every LOG_INTERVAL_S.

    A client can cause a line per frame or per socket (thousands a second); the next line
    says how many were held back.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # (time, held back)

    def warning(self, place: str, kind: str, message: str, logger: logging.Logger = log) -> None:
        now, key = self.clock(), (place, kind)
        last, held = self._last.pop(key, (None, 0))
        if last is not None and now - last < LOG_INTERVAL_S:
            self._last[key] = (last, held + 1)
            return
        if held:
            message += f" ({held} more like it from {place} in the last {now - last:.0f} s)"
        logger.warning("%s", message)
        self._last[key] = (now, 0)
        if len(self._last) > MAX_LOG_PLACES:
            del self._last[next(iter(self._last))]


class ConnectionLimits:
    """What a connection may cost, read from the server's current configuration; the sockets
    open, by place, and which of them are idle (may be closed to make room)."""

    def __init__(self, config: Callable[[], ServerConfig], frame_slack_bytes: int) -> None:
        self._config = config
        self._slack = frame_slack_bytes
        self.num_sockets = 0  # open sockets, HTTP and websocket
        self.sockets: dict[str, int] = {}  # by place (auth.address_group)
        # by place, longest idle first: each socket's transport, since when, how to close it
        self._idle: dict[str, dict[object, tuple[float, Callable[[], None]]]] = {}
        self.num_evicted = 0  # idle sockets closed to make room
        self.clock = time.monotonic
        self.log = PlaceLog()

    @property
    def max_read_rate(self) -> int:
        """Bytes a second, after a burst of two seconds' worth."""
        return self._config().max_frame_bytes + self._slack

    @property
    def max_write_buffer(self) -> int:
        """Bytes the transport may hold unsent (pongs the client does not read)."""
        return self._config().max_outbox_bytes + (64 << 10)

    @property
    def keepalive_s(self) -> float:
        return self._config().keepalive_s

    @property
    def user_timeout_ms(self) -> int:
        """Unacknowledged data this old (a client that stopped reading) ends the connection
        in the kernel, whatever user space still waits for: no socket outlives its client."""
        return round((self._config().write_timeout_s + CLOSE_TIMEOUT_S) * 1000)

    def open(self, place: str) -> bool:
        """Count a new socket: past a cap it closes an idle one; False past twice a cap."""
        per_place = self._config().max_connections + SOCKET_SLACK
        num_here = self.sockets.get(place, 0)
        made_room = False
        if num_here >= per_place:
            made_room = self._evict(place)
        elif self.num_sockets >= 2 * per_place:  # in all: the place holding the most gives way
            made_room = self._evict(max(self.sockets, key=self.sockets.__getitem__))
        if not made_room and (num_here >= 2 * per_place or self.num_sockets >= 4 * per_place):
            return False
        self.num_sockets += 1
        self.sockets[place] = num_here + 1
        return True

    def _evict(self, place: str) -> bool:
        """Close the place's longest idle socket, if idle MIN_IDLE_S (it counts until gone).

        A younger one is spared, or a client that reconnects at once would cycle through the
        place's idle sockets faster than a newcomer can send its request or hello.
        """
        idle = self._idle.get(place)
        if not idle:
            return False
        oldest = next(iter(idle))
        since, close = idle[oldest]
        if self.clock() - since < MIN_IDLE_S:
            return False
        self.in_use(place, oldest)
        self.num_evicted += 1
        self.log.warning(place, "evicted", f"{place}: too many sockets; the longest idle closed")
        close()
        return True

    def idle(self, place: str, transport, close: Callable[[], None]) -> None:
        """The socket waits for a request (or a hello): the newest idle of its place."""
        self.in_use(place, transport)
        self._idle.setdefault(place, {})[transport] = (self.clock(), close)

    def in_use(self, place: str, transport) -> None:
        idle = self._idle.get(place)
        if idle is not None and idle.pop(transport, None) is not None and not idle:
            del self._idle[place]

    def closed(self, place: str, transport) -> None:
        self.in_use(place, transport)
        self.num_sockets -= 1
        self.sockets[place] -= 1
        if not self.sockets[place]:
            del self.sockets[place]


class _ReadRate:
    """A token bucket over bytes read; pauses the transport while it is empty."""

    def __init__(self, protocol, rate: int) -> None:
        self.protocol = protocol
        self.rate = rate
        self.credit = self.burst = 2 * rate
        self.time = 0.0
        self.is_paused = False

    def charge(self, num_bytes: int) -> None:
        loop = self.protocol.loop
        now = loop.time()
        elapsed, self.time = now - self.time, now
        self.credit = min(self.burst, self.credit + elapsed * self.rate) - num_bytes
        if self.credit < 0:
            # again while paused: uvicorn's own flow control may have resumed reading
            self.protocol.transport.pause_reading()
            if not self.is_paused:
                self.is_paused = True
                loop.call_later(-self.credit / self.rate, self._end_pause)

    def _end_pause(self) -> None:
        self.is_paused = False
        self.protocol.resume_if_allowed()


def client_address(scope) -> str:
    """The client's IP address (the throttle's key)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def bearer_token(request: HTTPConnection) -> str | None:
    """The token of an `Authorization: Bearer` header (an API key, the monitor token)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _fix_buffers(transport, limits: ConnectionLimits) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_SEND_BYTES)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_RECEIVE_BYTES)
        if hasattr(socket, "TCP_USER_TIMEOUT"):  # Linux
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, limits.user_timeout_ms)


def _address(transport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if peer else "unknown"


class _HeadTooLarge(Exception):
    pass


class GuardedHTTP(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bounded head, a deadline and a read rate."""

    def __init__(self, *args, limits: ConnectionLimits, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._rate = _ReadRate(self, limits.max_read_rate)
        self._head_bytes = 0
        self._head_too_large = False
        self._head_timer = None
        self._running = None  # the request being answered (uvicorn keeps only the newest)
        self._place: str | None = None  # auth.address_group of the client's address

    def connection_made(self, transport) -> None:
        place = address_group(_address(transport))
        if not self.limits.open(place):
            message = f"{place}: too many sockets from there (or in all), none idle; refused"
            self.limits.log.warning(place, "refused", message)
            transport.abort()
            return
        self._place = place
        _fix_buffers(transport, self.limits)
        super().connection_made(transport)
        self._arm_head_timer()
        self._idle()

    def connection_lost(self, exc) -> None:
        if self._place is None:  # refused in connection_made
            return
        self.limits.closed(self._place, self.transport)
        self._cancel_head_timer()
        super().connection_lost(exc)
        # uvicorn tells only the newest request that the client left: tell the one being
        # answered and every pipelined one too, or they would run on for nobody
        for cycle in (self._running, *(c for c, _ in self.pipeline)):
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()

    def _start_asgi_task(self, cycle, app) -> None:
        self._running = cycle
        super()._start_asgi_task(cycle, app)

    def data_received(self, data: bytes) -> None:
        if self._head_too_large:
            return
        self._rate.charge(len(data))
        super().data_received(data)

    def abort(self) -> None:
        """Cut the connection now (it stopped reading: a close would wait for it)."""
        self.transport.abort()

    def _idle(self) -> None:
        """No request in progress: at its place's cap, this socket may be closed for another."""
        self.limits.idle(self._place, self.transport, self.transport.close)

    def resume_if_allowed(self) -> None:
        if not (self.flow.read_paused or self._rate.is_paused or self.transport.is_closing()):
            self.transport.resume_reading()

    # the request's head: bounded in bytes and in time

    def on_message_begin(self) -> None:
        self._head_bytes = 0
        self._rate.charge(FRAME_COST_BYTES)
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        super().on_header(name, value)

    def _count_head(self, num_bytes: int) -> None:
        self._head_bytes += num_bytes
        if self._head_bytes > MAX_HEAD_BYTES:
            self._head_too_large = True
            raise _HeadTooLarge  # httptools stops parsing; send_400_response answers

    def send_400_response(self, msg: str) -> None:
        if not self._head_too_large:
            return super().send_400_response(msg)
        body = f"request head over {MAX_HEAD_BYTES} bytes\n".encode()
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\n"
            b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n\r\n%s"
            % (len(body), body)
        )
        self.transport.close()

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        self.limits.in_use(self._place, self.transport)
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.scope is self.scope:
            self.scope.setdefault("extensions", {})["localserve"] = self
        if len(self.pipeline) > MAX_PIPELINED:
            log.warning("%s: over %d pipelined requests; cut", self.client, MAX_PIPELINED)
            self.transport.abort()

    def on_response_complete(self) -> None:
        starts_next = bool(self.pipeline)  # uvicorn starts the next pipelined request now
        super().on_response_complete()
        if not starts_next and not self.transport.is_closing():
            self._arm_head_timer()
            self._idle()

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_timeout)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        """No whole request head in HEAD_TIMEOUT_S (idle keep-alive ends sooner, by uvicorn)."""
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()


class GuardedWebSocket(WebSocketsSansIOProtocol):
    """uvicorn's websocket protocol (on `websockets`' Sans-I/O core), bounded."""

    def __init__(self, *args, limits: ConnectionLimits, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.close_timeout = CLOSE_TIMEOUT_S
        self._rate = _ReadRate(self, limits.max_read_rate)
        events_received = self.conn.events_received

        def counted_events():
            """Each frame costs the loop work (a pong, a decode), however few bytes it has."""
            events = events_received()
            if self.handshake_complete and events:
                self._rate.charge(FRAME_COST_BYTES * len(events))
            return events

        self.conn.events_received = counted_events

    def connection_made(self, transport) -> None:
        self._place = address_group(_address(transport))  # counted by GuardedHTTP, upgrading
        super().connection_made(transport)
        # idle until the app says the client spoke (a hello): room for others at the cap
        self.limits.idle(self._place, transport, self._evict)

    def connection_lost(self, exc) -> None:
        self.limits.closed(self._place, self.transport)
        super().connection_lost(exc)

    def mark_in_use(self) -> None:
        """The client said hello (or subscribed): never closed to make room for another."""
        self.limits.in_use(self._place, self.transport)

    def _evict(self) -> None:
        if self.handshake_complete and not self.close_sent:
            self._fail(CLOSE_NOT_READING, "too many sockets from your place; no hello on this one")
        else:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # the protocol answers each ping with a pong written at once, with no flow control: a
        # client that sends pings and reads nothing would grow this buffer without bound
        if self.transport.get_write_buffer_size() > self.limits.max_write_buffer:
            log.warning("%s: not reading its pongs; connection cut", self.client)
            self.transport.abort()
        elif not self.transport.is_closing():
            self._rate.charge(len(data))

    def handle_connect(self, event) -> None:
        super().handle_connect(event)
        if self.handshake_initiated and not self.close_sent:
            self.scope["extensions"]["localserve"] = self

    def abort(self) -> None:
        self.transport.abort()

    def start_keepalive(self) -> None:
        self.ping_interval = self.ping_timeout = self.limits.keepalive_s
        super().start_keepalive()

    @property
    def is_reading_paused(self) -> bool:
        """The server holds reading back (the rate, or a message the app has not taken)."""
        return self._rate.is_paused or self.read_paused

    def resume_if_allowed(self) -> None:
        if not (self.is_reading_paused or self.transport.is_closing()):
            self.transport.resume_reading()

    async def receive(self):
        # uvicorn resumes reading when the app takes the last message: not during a rate pause
        message = await self.queue.get()
        if self.read_paused and self.queue.empty():
            self.read_paused = False
            self.resume_if_allowed()
        return message

    def keepalive_timeout(self) -> None:
        """No pong in time: 1008, unless the server itself is not reading (its pong may wait)."""
        if self.is_reading_paused:
            self.pong_timer = None
            self.pending_ping_payload = None
            self.schedule_ping()
            return
        self.pong_timer = None
        self.pending_ping_payload = None
        if self.close_sent or self.transport.is_closing():
            return
        log.warning("%s: no pong within %g s; closing (1008)", self.client, self.ping_timeout)
        self._fail(CLOSE_NOT_READING, f"no pong within {self.ping_timeout:g} s")

    def _fail(self, code: int, reason: str) -> None:
        """Close with `code` whatever the app is doing; cut it off after close_timeout."""
        self.conn.fail(code, reason)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self.transport.close()
        self.loop.call_later(self.close_timeout, self.transport.abort)

    # malformed frames: the connection is closed, and the log gets one line, not a traceback

    def send_receive_event_to_app(self) -> None:
        # uvicorn logs a traceback at ERROR for each text message that is not UTF-8: check
        # first (non-ASCII text is decoded twice, ~0.1 ms per 256 KiB)
        if self.curr_msg_data_type == "text" and not self.close_sent:
            data = b"".join(self.frames)
            try:
                if not data.isascii():
                    data.decode()
            except UnicodeDecodeError as e:
                self.frames = []
                self.conn.fail(CLOSE_INVALID_DATA, f"invalid UTF-8 at byte {e.start}")
                return self.handle_parser_exception()
        super().send_receive_event_to_app()

    def handle_parser_exception(self) -> None:
        close = self.conn.close_sent
        if close is None:  # closing already: nothing more to say
            return self.transport.close()
        host = self.client[0] if self.client else "unknown"
        message = f"{host}: malformed websocket frame ({close.reason}); closed, {close.code}"
        self.limits.log.warning(self._place, "malformed", message)
        super().handle_parser_exception()

    async def send(self, message) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body"):
            self.handshake_complete = True  # answered (a refusal): not an error to log
        if message["type"] == "websocket.close" and self.close_timer is not None:
            # a client that reads nothing never lets a close finish: abort, do not wait
            self.close_timer.cancel()
            self.close_timer = self.loop.call_later(self.close_timeout, self.transport.abort)
