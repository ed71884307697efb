"""`localserve chat`: a plain terminal chat client.

Streams each reply as it arrives, keeps the conversation's history (the server is stateless:
every turn resends it), shows TTFT, ITL and tokens/s under each reply. Ctrl-C stops the
current reply (not the program); `/new` starts a new conversation; `/quit` or Ctrl-D leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from typing import TextIO

from localserve.client import Client, ClientError, ConnectionClosed, chat
from localserve.protocol.frames import Cancel, Chat, Error, Finished, Message, Notice, TokenDelta

HELP = "/new starts over, Ctrl-C stops a reply, /quit or Ctrl-D leaves"


async def stdin_lines() -> AsyncIterator[str]:
    """Lines from standard input without blocking the loop (ttys and pipes alike)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        yield line.decode(errors="replace").rstrip("\n")


class ChatClient:
    """One person's chat session with a server."""

    def __init__(
        self,
        url: str,
        user: str,
        token: str | None = None,
        max_tokens: int = 256,
        temperature: float = 0.7,
        lines: AsyncIterator[str] | None = None,
        out: TextIO = sys.stdout,
    ) -> None:
        self.url, self.user, self.token = url, user, token
        self.max_tokens, self.temperature = max_tokens, temperature
        self.lines = lines
        self.out = out
        self.history: list[Message] = []
        self.client: Client | None = None
        self._current: str | None = None  # id of the reply being streamed
        self._num = 0

    async def run(self) -> int:
        try:
            self.client = await Client.connect(self.url, self.user, self.token)
        except (OSError, ClientError) as e:
            self._print(f"localserve chat: cannot connect to {self.url}: {e}")
            return 1
        w = self.client.welcome
        self._print(f"Connected to {w.model} at {self.url} as {self.user}. {HELP}.")
        if w.quota is not None:
            self._print(quota_line(w.quota))
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, self.interrupt)
        try:
            return await self._converse()
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)
            await self.client.close()

    async def _converse(self) -> int:
        lines = self.lines or stdin_lines()
        while True:
            self._print("you> ", end="")
            line = await anext(lines, None)
            if line is None or line.strip() == "/quit":
                self._print("")
                return 0
            if line.strip() == "/new":
                self.history.clear()
                self._print("(new conversation)")
            elif line.strip() and not await self.ask(line.strip()):
                return 1

    def interrupt(self) -> None:
        """Ctrl-C: stop the reply being streamed; at the prompt, leave."""
        if self._current is not None and self.client is not None:
            asyncio.ensure_future(self.client.send(Cancel(self._current)))
        else:
            raise KeyboardInterrupt

    async def ask(self, text: str) -> bool:
        """Send one turn, stream the reply; False if the connection is gone."""
        self._num += 1
        rid = self._current = f"turn-{self._num}"
        self.history.append(Message("user", text))
        request = Chat(
            id=rid,
            messages=list(self.history),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
        )
        reply: list[str] = []
        self._print("model> ", end="")
        try:
            finished = await self._stream(request, reply)
        except (ConnectionClosed, ConnectionError) as e:
            self._print(f"\n[connection lost: {e}]")
            return False
        finally:
            self._current = None
        text = "".join(reply).strip()
        if finished is None:
            self.history.pop()  # the turn never happened
        else:
            self.history.append(Message("assistant", text))
            self._print("\n" + _summary(finished))
        return True

    async def _stream(self, request: Chat, reply: list[str]) -> Finished | None:
        """Print the reply as it arrives; its done frame, or None if it was refused."""
        async with contextlib.aclosing(chat(self.client, request)) as frames:
            async for frame in frames:
                if isinstance(frame, TokenDelta):
                    reply.append(frame.text)
                    self._print(frame.text, end="")
                elif isinstance(frame, Finished):
                    return frame
                elif isinstance(frame, Error):  # the last frame, unless `internal` (then done)
                    self._print(f"\n[error {frame.code}: {frame.message}]")
                elif isinstance(frame, Notice):
                    self._print(f"\n[server: {frame.message}]")
        return None

    def _print(self, text: str, end: str = "\n") -> None:
        self.out.write(text + end)
        self.out.flush()


def _summary(done: Finished) -> str:
    """The line under a reply: TTFT, ITL, tokens/s, tokens and how it ended."""
    t, n = done.timings, done.usage.completion_tokens
    parts = []
    if t.ttft_ms is not None:
        parts.append(f"TTFT {t.ttft_ms:.0f} ms")
    if t.itl_ms:
        parts += [f"ITL {t.itl_ms:.0f} ms", f"{1e3 / t.itl_ms:.1f} tokens/s"]
    parts += [f"{n} tokens", done.finish_reason]
    return "       [" + " · ".join(parts) + "]"


def quota_line(quota) -> str:
    """Where a user stands against their daily quota, from the welcome."""
    resets = quota.resets_at[11:16]  # HH:MM of the ISO time, the server's local clock
    return (
        f"Today: {quota.used_today:,} of your {quota.daily_tokens:,} tokens used, "
        f"{quota.remaining:,} left (resets at {resets})."
    )
