"""Hostile clients, for the benchmarks and the tests that play them against a server: a
websocket client on a bare socket that reads only when told to (`RawClient`), one process
squatting on sockets (`Squatter`), and whether `/healthz` still answers a client at some source
address (`healthy_from`). They speak the wire protocol by hand, so what they send is exactly what
a misbehaving client would; a server that breaks the protocol fails their assertions.

Tested in tests/e2e/test_guarded_transport.py, tests/e2e/test_hostile_clients.py and
tests/e2e/test_websocket_connection.py.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import selectors
import socket
import struct
import threading
import time


def healthy_from(url: str, source: str, timeout: float = 5.0) -> bool:
    """Whether `GET /healthz` answers 200 to a client at this source address."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout, source_address=(source, 0))
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


class RawClient:
    """A websocket client on a bare socket: it sends, and reads only when told to.

    Its receive buffer is small, so a server writing to it finds the socket full quickly,
    as it would with any client that stops reading.
    """

    def __init__(
        self,
        url: str,
        rcvbuf: int = 4096,
        source: str | None = None,
        sndbuf: int | None = None,
        headers: str = "",
    ) -> None:
        """`headers`: more handshake header lines, each ending in CRLF."""
        host, port = url.removeprefix("ws://").rstrip("/").split(":")
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if sndbuf:  # what it can push ahead of the server's reading
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        if source:
            self.sock.bind((source, 0))
        self.sock.settimeout(30)
        self.sock.connect((host, int(port)))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\n{headers}\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            byte = self.sock.recv(1)
            assert byte, f"closed during the handshake: {head!r}"
            head += byte
        assert head.startswith(b"HTTP/1.1 101"), head
        self.head = head  # the server's handshake response

    def send(self, frame: dict | str, opcode: int = 0x1) -> bool:
        """One masked frame (a zero mask: valid, and no copying); False once refused."""
        data = (frame if isinstance(frame, str) else json.dumps(frame)).encode()
        n, first = len(data), 0x80 | opcode
        if n < 126:
            head = struct.pack("!BB", first, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", first, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", first, 0x80 | 127, n)
        try:
            self.sock.sendall(head + b"\0\0\0\0" + data)
            return True
        except OSError:  # reset, or the server stopped reading and closed
            return False

    def send_raw(self, data: bytes) -> None:
        """Bytes as they are: a malformed frame, or a frame's head alone."""
        self.sock.sendall(data)

    def recv(self) -> dict:
        """The next frame from the server, which must be text (unmasked, unfragmented)."""
        opcode, payload = self.recv_frame()
        assert opcode == 0x1, (opcode, payload[:100])
        return json.loads(payload)

    def recv_frame(self) -> tuple[int, bytes]:
        """The next frame from the server: its opcode and payload."""
        first, second = self._exactly(2)
        n = second & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", self._exactly(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", self._exactly(8))
        return first & 0x0F, self._exactly(n)

    def close_frame(self, timeout: float = 10.0) -> tuple[int, str]:
        """Read on to the server's close frame (skipping what comes before): code, reason.

        Fails when the connection ends without one (a reset, or a close with no frame).
        """
        self.sock.settimeout(timeout)
        while True:
            opcode, payload = self.recv_frame()
            if opcode == 0x8:
                code = struct.unpack("!H", payload[:2])[0] if payload else 1005
                return code, payload[2:].decode()

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            try:
                chunk = self.sock.recv(n - len(data))
            except ConnectionResetError:
                chunk = b""
            assert chunk, "connection closed without a close frame"
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


class Squatter:
    """One local process holding `n` sockets it does nothing with; each one the server
    closes is opened again at once, as an attacker would.

    kind: "idle" (connected, nothing sent), "half-open" (a request head that never ends),
    "silent-ws" (websockets that never say hello) or "mixed" (a third of each).
    """

    KINDS = ("idle", "half-open", "silent-ws")

    def __init__(self, url: str, n: int = 100, kind: str = "mixed") -> None:
        host, port = url.split("//")[-1].rstrip("/").split(":")
        self.address = (host, int(port))
        kinds = self.KINDS if kind == "mixed" else (kind,)
        self.num_closed = 0  # by the server
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        for i in range(n):
            self._open(kinds[i % len(kinds)])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _opening(self, kind: str) -> bytes:
        if kind == "half-open":
            return b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
        if kind == "silent-ws":
            key = base64.b64encode(os.urandom(16)).decode()
            return (
                f"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        return b""

    def _open(self, kind: str) -> None:
        while not self._stop.is_set():
            try:
                sock = socket.create_connection(self.address, timeout=2)
                sock.sendall(self._opening(kind))
                break
            except OSError:
                time.sleep(0.001)
        else:
            return
        sock.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ, kind)

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(0.1):
                try:
                    gone = not key.fileobj.recv(65536)  # a 101, a ping: read, never answered
                except BlockingIOError:
                    continue
                except OSError:
                    gone = True
                if gone:
                    self._selector.unregister(key.fileobj)
                    key.fileobj.close()
                    self.num_closed += 1
                    self._open(key.data)

    @property
    def num_open(self) -> int:
        return len(self._selector.get_map())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()
