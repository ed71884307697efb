"""A small asyncio client for the protocol: connect, say hello, send frames, read frames.

Used by the terminal chat client, the monitor and the load generator; anyone else can follow
docs/protocol.md instead.
"""

from __future__ import annotations

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from localserve.protocol import ClientFrame, Error, Hello, ServerFrame, Welcome

_decoder = msgspec.json.Decoder(ServerFrame)
_encoder = msgspec.json.Encoder()


__all__ = ["Client", "ClientError", "ConnectionClosed"]


class ClientError(Exception):
    """The server answered with an error (or not at all)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class Client:
    """One websocket connection to a localserve server."""

    def __init__(self, ws: ClientConnection, welcome: Welcome | None = None) -> None:
        self.ws = ws
        self.welcome = welcome

    @classmethod
    async def connect(cls, url: str, user: str | None = None, token: str | None = None) -> Client:
        """Open a connection; with a user, say hello and wait for the welcome."""
        try:
            ws = await connect(url, max_size=None, open_timeout=10)
        except InvalidHandshake as e:  # e.g. 503: the server has all the connections it takes
            raise ClientError("unavailable", str(e)) from None
        client = cls(ws)
        if user is not None:
            await client.send(Hello(user, token))
            frame = await client.recv()
            if isinstance(frame, Error):
                await ws.close()
                raise ClientError(frame.code, frame.message)
            client.welcome = frame
        return client

    async def send(self, frame: ClientFrame) -> None:
        await self.ws.send(_encoder.encode(frame), text=True)

    async def recv(self) -> ServerFrame:
        return _decoder.decode(await self.ws.recv())

    async def close(self) -> None:
        await self.ws.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
