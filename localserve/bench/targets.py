"""Where the load generator sends its chats, and what it measures of each one.

A `Target` takes a `BenchRequest` (messages and sampling, the same for every server) and returns a
`RequestResult` (timestamps taken on the client, usage as the server reports it). Two kinds:

- `WebSocketTarget`: localserve's own protocol, one connection per user;
- `OpenAITarget`: an OpenAI-compatible streaming endpoint (llama.cpp's `llama-server`, or
  localserve's /v1), over HTTP/1.1 with server-sent events, `completions` or `chat`.

Both run on the caller's event loop: no thread per request (threads would add GIL waits to the
timestamps).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol

from localserve.protocol.frames import Chat, Error, Finished, Message, TokenDelta
from localserve.serve.prompt import TRANSCRIPT_STOPS, render_transcript
from localserve.websocket_client import Client, ClientError, ConnectionClosed, chat

ENDPOINTS = ("completions", "chat")


@dataclass(frozen=True)
class BenchRequest:
    """One chat, as any target sends it."""

    kind: str  # the workload's label for it ("short", "turn-3", "cold", ...)
    messages: tuple[tuple[str, str], ...]  # (role, content)
    max_tokens: int
    temperature: float
    seed: int
    ignore_eos: bool = False
    reuse: bool = True  # False: ask the server not to reuse cached prompt tokens, where it can
    response_format: dict | None = None  # OpenAI's (a json_schema one for the json workload)


@dataclass
class RequestResult:
    """One request as the client saw it (the definitions are vLLM's `bench serve`'s)."""

    kind: str
    ok: bool = False
    error: str = ""
    finish_reason: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the server reused from its cache (0 if unreported)
    output_tokens: int = 0
    sent: float = 0.0
    token_times: list[float] = field(default_factory=list)  # arrival of each token frame
    done: float = 0.0

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.sent if self.token_times else None

    @property
    def e2e(self) -> float:
        return self.done - self.sent

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2 or self.ttft is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]


class Session(Protocol):
    """The turns of one conversation, sent in order."""

    async def ask(self, request: BenchRequest) -> tuple[RequestResult, str]:
        """Send one request and wait for it to end: its result and the reply's text."""
        ...


class Target(Protocol):
    """A server under load. Failures come back as results with an `error`, never raised."""

    async def send(self, user: str, request: BenchRequest) -> RequestResult:
        """One request on its own connection, under `user`."""
        ...

    def session(self, user: str) -> AbstractAsyncContextManager[Session]:
        """A conversation's session (for `user` where the transport names one)."""
        ...


def target(url: str, openai: bool = False, endpoint: str = "completions") -> Target:
    """The target a URL names: localserve's websocket, or with `openai` an OpenAI endpoint."""
    return OpenAITarget(url, endpoint) if openai else WebSocketTarget(url)


# --- localserve's websocket protocol -------------------------------------------------------------


class WebSocketTarget:
    """localserve's protocol: a connection per session (and per single request)."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def send(self, user: str, request: BenchRequest) -> RequestResult:
        async with self.session(user) as session:
            result, _ = await session.ask(request, rid="r")
        return result

    @contextlib.asynccontextmanager
    async def session(self, user: str) -> AsyncIterator[WebSocketSession]:
        session = WebSocketSession(self.url, user)
        try:
            yield session
        finally:
            await session.close()


class WebSocketSession:
    """One connection under one user, opened by the first request. The protocol has no switch
    for prefix reuse (`reuse` is ignored): a cold request is one from another user."""

    def __init__(self, url: str, user: str) -> None:
        self.url, self.user = url, user
        self.client: Client | None = None

    async def ask(self, request: BenchRequest, rid: str | None = None) -> tuple[RequestResult, str]:
        """Send the request as a chat (its id `rid`, else its kind), timed from the chat frame
        to its done frame; a failed connection is a result with the exception's name."""
        try:
            if self.client is None:
                self.client = await Client.connect(self.url, self.user)
            return await _timed_chat(self.client, _chat(request, rid or request.kind), request.kind)
        except (OSError, ConnectionClosed, ClientError) as e:
            return RequestResult(request.kind, error=type(e).__name__), ""

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()


def _chat(request: BenchRequest, rid: str) -> Chat:
    return Chat(
        id=rid,
        messages=[Message(role, content) for role, content in request.messages],
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        seed=request.seed,
        ignore_eos=request.ignore_eos,
        response_format=request.response_format,
    )


async def _timed_chat(client: Client, request: Chat, kind: str) -> tuple[RequestResult, str]:
    """Send one chat on an open connection; its timings and the reply text."""
    result, reply = RequestResult(kind), []
    result.sent = time.perf_counter()
    async for frame in chat(client, request):
        if isinstance(frame, TokenDelta):
            result.token_times.append(time.perf_counter())
            reply.append(frame.text)
        elif isinstance(frame, Error) and frame.code != "internal":
            result.error = frame.code
        elif isinstance(frame, Finished):
            result.done = time.perf_counter()
            result.finish_reason = frame.finish_reason
            result.ok = frame.finish_reason in ("stop", "length")
            result.error = "" if result.ok else frame.finish_reason
            result.prompt_tokens = frame.usage.prompt_tokens
            result.cached_tokens = frame.usage.cached_tokens
            result.output_tokens = frame.usage.completion_tokens
    return result, "".join(reply)


# --- an OpenAI-compatible endpoint ---------------------------------------------------------------


class OpenAITarget:
    """An OpenAI-compatible server, streamed (SSE), one HTTP request per chat.

    `completions` (any server, llama-server too): the messages are rendered as the transcript
    localserve uses for the embedded base model, so both servers see the same tokens; like
    localserve, the end-of-turn stop is dropped for ignore_eos. `chat` (localserve's /v1): the
    messages, rendered by the server exactly as for a websocket chat. A single request names
    its user (localserve's per-user limits; llama-server ignores it); a session's turns name
    none, so the server takes its default user. `reuse=False` sends `cache_prompt: false`
    (llama-server's switch).
    """

    def __init__(self, url: str, endpoint: str = "completions") -> None:
        if endpoint not in ENDPOINTS:
            raise ValueError(f"--endpoint: {endpoint!r} is not one of {', '.join(ENDPOINTS)}")
        self.url, self.endpoint = url, endpoint

    async def send(self, user: str, request: BenchRequest) -> RequestResult:
        result, _ = await self._post(request, user)
        return result

    @contextlib.asynccontextmanager
    async def session(self, user: str) -> AsyncIterator[OpenAISession]:
        yield OpenAISession(self)

    async def _post(self, request: BenchRequest, user: str | None) -> tuple[RequestResult, str]:
        body = self.body(request)
        if user is not None:
            body["user"] = user
        return await _stream_http(self.url, self.path, body, request.kind)

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"

    def body(self, request: BenchRequest) -> dict:
        """The JSON body of a streaming request, usage included."""
        body: dict = {
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "seed": request.seed,
            "stream": True,
            "ignore_eos": request.ignore_eos,
            "stream_options": {"include_usage": True},
        }
        if self.endpoint == "chat":
            body["messages"] = [{"role": r, "content": c} for r, c in request.messages]
        else:
            body["prompt"] = render_transcript(request.messages)
            body["stop"] = [] if request.ignore_eos else list(TRANSCRIPT_STOPS)
        if not request.reuse:
            body["cache_prompt"] = False
        if request.response_format is not None:  # completions: llama-server's json_schema
            if self.endpoint == "chat":
                body["response_format"] = request.response_format
            else:
                body["json_schema"] = request.response_format["json_schema"]["schema"]
        return body


class OpenAISession:
    """HTTP keeps no conversation: each turn is a request of its own, under no user name."""

    def __init__(self, target: OpenAITarget) -> None:
        self.target = target

    async def ask(self, request: BenchRequest) -> tuple[RequestResult, str]:
        return await self.target._post(request, None)


async def _stream_http(
    base_url: str, path: str, body: dict, kind: str
) -> tuple[RequestResult, str]:
    """POST a streaming request; its timings and text.

    HTTP/1.1 on an asyncio stream, like the websocket client. Cached prompt tokens:
    `usage.prompt_tokens_details.cached_tokens` (OpenAI's field, which llama-server fills), else
    llama-server's `timings.cache_n`.
    """
    result, reply = RequestResult(kind), []
    url = urllib.parse.urlsplit(base_url)
    payload = json.dumps(body).encode()
    writer = None
    try:
        reader, writer = await asyncio.open_connection(url.hostname, url.port or 80)
        result.sent = time.perf_counter()
        head = (
            f"POST {url.path.rstrip('/')}{path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(head.encode() + payload)
        status, headers = await _read_head(reader)
        if status != 200:
            result.error = f"http_{status}"
            return result, ""
        await _read_events(reader, headers.get("transfer-encoding") == "chunked", result, reply)
    except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as e:
        result.error = type(e).__name__
    finally:
        if writer is not None:
            writer.close()
    return result, "".join(reply)


async def _read_events(
    reader: asyncio.StreamReader, chunked: bool, result: RequestResult, reply: list[str]
) -> None:
    """Fold the event stream into the result, to its end or to an error event."""
    cached = None
    async for line in _sse_lines(reader, chunked):
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[5:])
        if "error" in chunk:  # e.g. llama-server's "Context size has been exceeded"
            result.error = str(chunk["error"].get("type") or "server_error")
            return
        cached = _take_chunk(result, reply, chunk, cached)
    result.done = time.perf_counter()
    result.output_tokens = result.output_tokens or len(result.token_times)
    result.cached_tokens = cached or 0
    result.ok = bool(result.finish_reason)
    result.error = "" if result.ok else "no_finish"


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """An HTTP response's status and headers (names in lower case)."""
    status = int((await reader.readline()).split()[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def _take_chunk(result: RequestResult, reply: list[str], chunk: dict, cached: int | None):
    """Fold one streamed chunk into the result; returns the cached-token count seen so far."""
    choices = chunk.get("choices") or []
    text = choices and (choices[0].get("text") or (choices[0].get("delta") or {}).get("content"))
    if text:
        result.token_times.append(time.perf_counter())
        reply.append(text)
    if choices and choices[0].get("finish_reason"):
        result.finish_reason = choices[0]["finish_reason"]
    usage = chunk.get("usage") or {}
    if usage:
        result.prompt_tokens = usage.get("prompt_tokens", 0)
        result.output_tokens = usage.get("completion_tokens", 0)
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            cached = details["cached_tokens"]
    timings = chunk.get("timings") or {}
    if cached is None and timings.get("cache_n") is not None:
        cached = timings["cache_n"]
    if not result.prompt_tokens and "prompt_n" in timings:
        result.prompt_tokens = timings["prompt_n"] + timings.get("cache_n", 0)
    return cached


async def _sse_lines(reader: asyncio.StreamReader, chunked: bool) -> AsyncIterator[str]:
    """The body's lines (decoded, stripped), through chunked transfer coding if used."""
    buffer = b""
    while True:
        if chunked:
            size = int((await reader.readline()).split(b";")[0], 16)
            data = (await reader.readexactly(size + 2))[:-2]  # the chunk, less its CRLF
        else:
            data = await reader.read(65536)
        if not data:
            if buffer.strip():
                yield buffer.decode().strip()
            return
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield line.decode().strip()
