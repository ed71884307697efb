"""A small asyncio client for the protocol: connect, say hello, send frames, read frames.

`chat` sends one chat and yields the frames about it until it is over: the one loop behind the
terminal chat client, the demo's people and the load generator. `stored` asks the server's
conversation store one thing (list, get, save) and returns its answer. The monitor uses
`Client` too; anyone else can follow docs/protocol.md instead.

Tested in tests/e2e/test_websocket_client.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from localserve.protocol.frames import (
    Cancel,
    Chat,
    ClientFrame,
    ConversationFound,
    ConversationList,
    ConversationSaved,
    Error,
    Finished,
    GetConversation,
    Hello,
    ListConversations,
    Notice,
    Queued,
    SaveConversation,
    ServerFrame,
    TokenDelta,
    Welcome,
)

_decoder = msgspec.json.Decoder(ServerFrame)
_encoder = msgspec.json.Encoder()


__all__ = [
    "ChatFrame",
    "Client",
    "ClientError",
    "ConnectionClosed",
    "chat",
    "stored",
    "websocket_url",
]

ChatFrame = Queued | TokenDelta | Finished | Error | Notice
StoreFrame = ListConversations | GetConversation | SaveConversation
StoreAnswer = ConversationList | ConversationFound | ConversationSaved


_SCHEMES = {"ws": "ws", "wss": "wss", "http": "ws", "https": "wss"}


def websocket_url(url: str) -> str:
    """The websocket URL for what a person types: the `http://host:port` address the server
    prints (http becomes ws, https wss), `host:port` without a scheme (ws), or a ws:// URL.
    The server answers websockets on any path, so the rest is kept as it is."""
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep:
        return f"ws://{url}"
    if scheme.lower() not in _SCHEMES:
        raise ValueError(f"{url}: not a server address (use ws://host:port or http://host:port)")
    return f"{_SCHEMES[scheme.lower()]}://{rest}"


class ClientError(Exception):
    """The server answered with an error (or not at all)."""

    def __init__(self, code: str, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s  # the server's: a refusal that passes by waiting


class Client:
    """One websocket connection to a localserve server."""

    def __init__(self, ws: ClientConnection, welcome: Welcome | None = None) -> None:
        self.ws = ws
        self.welcome = welcome

    @classmethod
    async def connect(cls, url: str, user: str | None = None, token: str | None = None) -> Client:
        """Open a connection; with a user, say hello and wait for the welcome."""
        try:
            ws = await connect(websocket_url(url), max_size=None, open_timeout=10)
        except InvalidHandshake as e:  # e.g. 503: the server has all the connections it takes
            raise ClientError("unavailable", str(e)) from None
        client = cls(ws)
        if user is not None:
            await client.send(Hello(user, token))
            frame = await client.recv()
            if isinstance(frame, Error):
                await ws.close()
                raise ClientError(frame.code, frame.message, frame.retry_after_s)
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


async def chat(client: Client, request: Chat) -> AsyncIterator[ChatFrame]:
    """Send `request` and yield the frames about it, ending after its `done` or its error.

    Yields the chat's `queued` (once, and again after a preemption), `token` and `done` frames,
    the error frames that carry its id or none (an error without an id answers a chat whose id
    the server could not read), and every `notice`; frames about other requests and `stats`
    frames are skipped. It ends after `done`, or after an error that ends the request: any code
    but `internal`, whose `done` follows. One chat at a time per client: this reads the
    connection. Stopped before the end (`aclose`, or its task cancelled), it cancels the
    request on the server, best effort. A closed connection raises `ConnectionClosed`.
    """
    settled = False  # the server is done with the request: nothing to cancel
    await client.send(request)
    try:
        while True:
            frame = await client.recv()
            if isinstance(frame, Notice):
                yield frame
                continue
            if not _about(frame, request.id):
                continue
            settled = settled or isinstance(frame, Finished | Error)
            yield frame
            if isinstance(frame, Finished):
                return
            if isinstance(frame, Error) and frame.code != "internal":
                return
    finally:
        if not settled:
            with contextlib.suppress(ConnectionClosed, OSError):
                await client.send(Cancel(request.id))


def _about(frame: ServerFrame, rid: str) -> bool:
    """Whether a frame concerns the request `rid` (an error without an id concerns it too)."""
    if isinstance(frame, Error):
        return frame.id in (rid, None)
    return isinstance(frame, Queued | TokenDelta | Finished) and frame.id == rid


async def stored(client: Client, frame: StoreFrame) -> StoreAnswer:
    """Send one conversation-store frame and return its answer: a `conversation_list`, the
    `conversation` asked for, or this connection's `conversation_saved` (`here`). An error about
    it raises ClientError (`unknown_id`, `conflict`, `not_saved`, ...). Frames about anything
    else (the person's other connections' news, notices, stats) are skipped. One request at a
    time per client: this reads the connection."""
    await client.send(frame)
    while True:
        answer = await client.recv()
        if isinstance(answer, Error) and answer.id in (_store_id(frame), None):
            raise ClientError(answer.code, answer.message, answer.retry_after_s)
        if _answers(answer, frame):
            return answer


def _store_id(frame: StoreFrame) -> str | None:
    if isinstance(frame, SaveConversation):
        return frame.conversation.id
    return getattr(frame, "id", None)


def _answers(answer: ServerFrame, frame: StoreFrame) -> bool:
    if isinstance(frame, ListConversations):
        return isinstance(answer, ConversationList) and answer.offset == frame.offset
    if isinstance(frame, GetConversation):
        return isinstance(answer, ConversationFound) and answer.summary.id == frame.id
    is_ours = isinstance(answer, ConversationSaved) and answer.here  # not another's news
    return is_ours and answer.summary.id == frame.conversation.id
