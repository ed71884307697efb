"""`localserve chat`: a plain terminal chat client.

Streams each reply as it arrives, keeps the conversation's history (the server is stateless:
every turn resends it), shows TTFT, ITL and tokens/s under each reply. Ctrl-C stops the
current reply (not the program); at the prompt it leaves, with status 0 like `/quit` and
Ctrl-D. `/help` lists the client's commands; any other `/word` is answered here, not sent to
the model (`//` at the start sends one `/`). Standard input from a file or a pipe is read as
messages, one a line, each reply printed, until its end. A thinking model's reasoning (the
token frames' `reasoning`) is printed before its answer, each line starting "thinking: ",
dimmed on a terminal; it is not kept in the history the model is sent again. On a server that
keeps its people's conversations, each turn is saved there, and `/chats` and `/resume` list and
go on with them (tui/server_chats.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import signal
import stat
import sys
from collections.abc import AsyncIterator
from typing import TextIO

from localserve.protocol.frames import (
    Cancel,
    Chat,
    Error,
    Finished,
    Message,
    Notice,
    Queued,
    TokenDelta,
)
from localserve.websocket_client import Client, ClientError, ConnectionClosed, chat
from tui import model_picker, server_chats
from tui.waiting import WaitLine

MAX_LINE_CHARS = 256 << 10  # a message from standard input: the server's max_frame_bytes default
TOO_LONG = f"a line of standard input is over {MAX_LINE_CHARS:,} characters"

HELP = "/help lists the commands, Ctrl-C stops a reply, /quit or Ctrl-D leaves"
COMMANDS = (
    ("/new", "start a new conversation (the model forgets this one)"),
    *model_picker.COMMANDS,
    *server_chats.COMMANDS,
    ("/help", "this list"),
    ("/quit", "leave (so do Ctrl-D, and Ctrl-C at the prompt)"),
)
COMMANDS_HELP = "\n".join(
    [f"  {name:8} {what}" for name, what in COMMANDS]
    + ["  Ctrl-C while a reply streams stops it; a line starting // sends one /"]
)
DIM, UNDIM = "\x1b[2m", "\x1b[0m"
THINKING = "thinking: "
_COMMAND = re.compile(r"/[A-Za-z][\w-]*")  # "/new", not "/usr/bin ..." or "/ 2"
# what the server says when a hello's token does not match: with no token sent, the fix is one
NO_TOKEN = (
    "this server needs a token: pass --token, --token-file FILE or set $LOCALSERVE_TOKEN "
    "(ask whoever runs it for yours)"
)


def is_file_like(stream: TextIO) -> bool:
    """Whether `stream` is a regular file or a device that is not a terminal (/dev/null):
    reading it never waits, and asyncio cannot watch it."""
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(mode) or (stat.S_ISCHR(mode) and not stream.isatty())


async def stdin_lines() -> AsyncIterator[str]:
    """Lines from standard input without blocking the loop (ttys, pipes and files alike), each
    at most MAX_LINE_CHARS (a longer one is a ValueError saying so: the server would refuse
    it anyway)."""
    if is_file_like(sys.stdin):  # a file never blocks: read it as it is
        while line := sys.stdin.readline(MAX_LINE_CHARS + 1):
            yield _line(line)
        return
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE_CHARS + 1)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        try:
            line = await reader.readline()
        except ValueError:  # past the reader's limit
            raise ValueError(TOO_LONG) from None
        if not line:
            return
        yield _line(line.decode(errors="replace"))


def _line(line: str) -> str:
    if len(line.rstrip("\n")) > MAX_LINE_CHARS:
        raise ValueError(TOO_LONG)
    return line.rstrip("\n")


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
        echo: bool = False,
        err: TextIO | None = None,
        color: bool | None = None,
        model: str | None = None,
        resume: str | None = None,
    ) -> None:
        self.url, self.user, self.token = url, user, token
        self.max_tokens, self.temperature = max_tokens, temperature
        self.lines = lines
        self.out = out
        self.echo = echo  # print each line after the prompt (input that is not a terminal)
        self.err = err or out  # where a failure to connect is said
        # reasoning dimmed: on a terminal only (not in a file or a pipe), unless $NO_COLOR
        self.color = color if color is not None else _is_terminal(out)
        self.history: list[Message] = []
        self.picker = model_picker.ModelPicker(model, self._print)  # /model, --model
        self.kept = server_chats.ServerChats(self.history, self._print, self.picker)
        self.resume = resume  # --resume: this conversation ("" the newest) before the first turn
        self._stopped = False  # the person stopped the reply being streamed (Ctrl-C)
        self.client: Client | None = None
        self._current: str | None = None  # id of the reply being streamed
        self._leave: asyncio.Future | None = None  # set at Ctrl-C while waiting at the prompt
        self._num = 0

    async def run(self) -> int:
        try:
            self.client = await Client.connect(self.url, self.user, self.token)
        except ClientError as e:
            if e.code == "unauthorized" and not self.token:  # we sent none: say what is missing
                self._print(f"localserve chat: {self.url}: {NO_TOKEN}", file=self.err)
                return 2
            self._print(f"localserve chat: cannot connect to {self.url}: {e}", file=self.err)
            return 2 if e.code == "unauthorized" else 1  # a wrong name or token: a slip
        except OSError as e:
            self._print(f"localserve chat: {connect_failure(self.url, e)}", file=self.err)
            return 1
        w = self.client.welcome
        self.picker.client = self.client
        if self.picker.model and (refused := self.picker.unknown(self.picker.model)):
            self._print(f"localserve chat: --model: {refused}", file=self.err)
            await self.client.close()
            return 2
        model = self.picker.model or w.model
        self._print(f"Connected to {model} at {self.url} as {self.user}. {HELP}.")
        if w.quota is not None:
            self._print(quota_line(w.quota))
        self.kept.client = self.client
        if self.resume is not None and not await self.kept.resume(self.resume, self.err):
            await self.client.close()
            return 2
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
            line = await self._next_line(lines)
            if line is not None and self.echo:
                self._print(line)
            text = line.strip() if line is not None else None
            if text is None or text.split(maxsplit=1)[:1] == ["/quit"]:
                self._print("")
                return 0
            if _COMMAND.fullmatch(text.split(maxsplit=1)[0] if text else ""):
                if not await self.picker.command(text) and not await self.kept.command(text):
                    self.command(text)
                continue
            if text.startswith("//"):
                text = text[1:]
            if text and not await self.ask(text):
                return 1

    async def _next_line(self, lines: AsyncIterator[str]) -> str | None:
        """The next line typed, or None at its end or at Ctrl-C (interrupt below)."""
        self._leave = asyncio.get_running_loop().create_future()
        typed = asyncio.ensure_future(anext(lines, None))
        try:
            await asyncio.wait((typed, self._leave), return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._leave = None
        if typed.done():
            return typed.result()
        typed.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await typed
        return None

    def command(self, text: str) -> None:
        """One of the client's own commands (anything but /quit): never sent to the model."""
        word = text.split(maxsplit=1)[0]
        if word == "/new":
            self.history.clear()
            self.kept.new()
            self._print("(new conversation)")
        elif word == "/help":
            self._print(COMMANDS_HELP)
        else:
            self._print(f"unknown command {word}; /help lists them")

    def interrupt(self) -> None:
        """Ctrl-C: stop the reply being streamed; at the prompt, leave (status 0)."""
        if self._current is not None and self.client is not None:
            self._stopped = True
            asyncio.ensure_future(self.client.send(Cancel(self._current)))
        elif self._leave is not None and not self._leave.done():
            self._leave.set_result(None)  # _converse ends as at Ctrl-D
        else:
            raise KeyboardInterrupt

    async def ask(self, text: str) -> bool:
        """Send one turn, stream the reply; False if the connection is gone."""
        self._num += 1
        rid = self._current = f"turn-{self._num}"
        self._stopped = False
        self.history.append(Message("user", text))
        request = Chat(
            id=rid,
            messages=list(self.history),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            model=self.picker.model,
        )
        reply = ReplyPrinter(self._print, self.color)
        self._print("model> ", end="")
        try:
            finished = await self._stream(request, reply)
        except (ConnectionClosed, ConnectionError) as e:
            self._print(f"\n[connection lost: {e}]")
            return False
        finally:
            self._current = None
        reply.end()
        answer = reply.answer()
        if finished is None:
            self.history.pop()  # the turn never happened
        else:
            self.history.append(Message("assistant", answer))
            self._print("\n" + _summary(finished))
            if finished.dropped_messages:
                self._print(dropped_line(finished.dropped_messages))
            await self.kept.turn(text, answer, reply.thought(), finished, self._stopped)
        return True

    async def _stream(self, request: Chat, reply: ReplyPrinter) -> Finished | None:
        """Print the reply as it arrives; its done frame, or None if it was refused. While it
        waits for its turn, on a terminal, its place and predicted wait count down (waiting.py)."""
        line = WaitLine(self._print) if _is_terminal(self.out, color=False) else None
        async with contextlib.aclosing(chat(self.client, request)) as frames:
            async for frame in frames:
                if isinstance(frame, Queued):
                    if line is not None:
                        line.update(frame.position, frame.wait_s, frame.loading)
                    continue
                if line is not None:
                    line.clear()
                if isinstance(frame, TokenDelta):
                    reply.reasoning(frame.reasoning)
                    reply.text(frame.text)
                elif isinstance(frame, Finished):
                    return frame
                elif isinstance(frame, Error):  # the last frame, unless `internal` (then done)
                    self._print(f"\n[error {frame.code}: {frame.message}]")
                elif isinstance(frame, Notice):
                    self._print(f"\n[server: {frame.message}]")
        return None

    def _print(self, text: str, end: str = "\n", file: TextIO | None = None) -> None:
        out = file or self.out
        out.write(text + end)
        out.flush()


def _is_terminal(out: TextIO, color: bool = True) -> bool:
    """`out` is a terminal (and, with `color`, $NO_COLOR is not set)."""
    try:
        return out.isatty() and not (color and os.environ.get("NO_COLOR"))
    except (AttributeError, ValueError):  # closed, or not a real stream
        return False


class ReplyPrinter:
    """Prints one reply as it streams: its reasoning first, each line starting "thinking: "
    (dimmed when `color`), then its answer on a line of its own; keeps the answer's text.
    Blank lines at the ends of the reasoning and the answer's leading ones are left out."""

    def __init__(self, write, color: bool) -> None:
        self._write = write  # print-like: write(text, end="")
        self._color = color
        self._answer: list[str] = []
        self._thought: list[str] = []  # the reasoning as it came, kept with a saved reply
        self._thinking = False  # reasoning printed, the answer not started
        self._newlines = 0  # reasoning newlines not printed yet (none after its last line)

    def reasoning(self, text: str) -> None:
        self._thought.append(text)
        for i, line in enumerate(text.split("\n")):
            if i:
                self._newlines += 1 if self._thinking else 0
            if not line:
                continue
            if not self._thinking:
                self._thinking = True
                piece = THINKING + line
            else:
                piece = ("\n" + THINKING) * self._newlines + line
            self._newlines = 0
            self._write(f"{DIM}{piece}{UNDIM}" if self._color else piece, end="")

    def text(self, text: str) -> None:
        if self._thinking or not self._answer:
            text = text.lstrip("\n")  # the answer starts on the line under the reasoning
        if not text:
            return
        if self._thinking:
            self._write("\n", end="")
            self._thinking = False
        self._answer.append(text)
        self._write(text, end="")

    def end(self) -> None:
        """The reply is over: nothing more to print of it (the summary line comes next)."""
        self._thinking = False

    def answer(self) -> str:
        return "".join(self._answer).strip()

    def thought(self) -> str:
        return "".join(self._thought).strip()


def _summary(done: Finished) -> str:
    """The line under a reply: TTFT, ITL, tokens/s, tokens and how it ended."""
    t, n = done.timings, done.usage.completion_tokens
    parts = []
    if t.ttft_ms is not None:
        parts.append(f"TTFT {t.ttft_ms:.0f} ms")
    if t.itl_ms:
        parts += [f"ITL {t.itl_ms:.0f} ms", f"{1e3 / t.itl_ms:.1f} tokens/s"]
    parts.append(f"{n} tokens")
    if t.draft_n:  # speculative decoding: tokens that came without a step of their own
        parts.append(f"{t.draft_n_accepted or 0} drafted")
    parts.append(done.finish_reason)
    return "       [" + " · ".join(parts) + "]"


def connect_failure(url: str, e: OSError) -> str:
    """Why a connection failed, in one line: nothing listening gets what to do about it (asyncio
    tries each address of a name, and may give all their refusals in one OSError)."""
    refused = f"[Errno {errno.ECONNREFUSED}]"
    if e.errno == errno.ECONNREFUSED or (e.errno is None and refused in str(e)):
        return (
            f"nothing listens at {url}: start a server with `localserve serve` (or `make run`), "
            "or give the address it printed"
        )
    return f"cannot connect to {url}: {e.strerror or e}"


def dropped_line(num_dropped: int) -> str:
    """The notice under a reply to a chat the server shortened to fit the model's context."""
    oldest = "oldest message was" if num_dropped == 1 else f"{num_dropped} oldest messages were"
    return f"       [the {oldest} left out: the chat is longer than the model's context]"


def quota_line(quota) -> str:
    """Where a user stands against their daily quota, from the welcome."""
    resets = quota.resets_at[11:16]  # HH:MM of the ISO time, the server's local clock
    return (
        f"Today: {quota.used_today:,} of your {quota.daily_tokens:,} tokens used, "
        f"{quota.remaining:,} left (resets at {resets})."
    )
