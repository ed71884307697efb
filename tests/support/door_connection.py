"""A websocket `Connection` (localserve/serve/websocket/connection.py) on a door, over an
in-memory socket (tests/support/asgi.py's WebsocketSession): the websocket front-end's unit
tests (tests/unit/serve/websocket/) open one, or several sharing one `Connections`, each with its
hello said."""

from __future__ import annotations

import asyncio
import contextlib

from localserve.serve.websocket.connection import Connection
from localserve.serve.websocket.connections import Connections
from tests.support.asgi import WebsocketSession


def connections_of(door, conversations=None) -> Connections:
    """The registry every connection of one server shares (no snapshots: no stats frames)."""
    return Connections(door, None, lambda: None, lambda: None, conversations)


@contextlib.asynccontextmanager
async def connected(
    door, user: str | None = "ann", token: str | None = None, connections: Connections | None = None
):
    """A connection on `door`, its hello said (as `user`, when given) and welcomed; the client
    closes it at the end. `connections`: the registry it joins (else one of its own)."""
    if connections is None:  # (a registry with no member yet is falsy: it has a len)
        connections = connections_of(door)
    socket = WebsocketSession()
    conn = Connection(door, connections, socket.scope, socket.receive, socket.send,
                      door.next_number())  # fmt: skip
    connections.add(conn)
    task = asyncio.create_task(conn.run())
    try:
        if user is not None:
            socket.say({"type": "hello", "user": user, "token": token})
            await socket.next_of("welcome")
        yield socket
    finally:
        socket.leave()
        await asyncio.wait_for(task, 30)
