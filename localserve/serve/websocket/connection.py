"""One websocket connection: its user, its requests, its outbox (docs/protocol.md).

Frames are decoded by one reused msgspec decoder into the closed union of client frames; every
problem with a frame is an `error` frame and the connection goes on. Chats go to admission
through its `Frontdoor`; the server routes engine events to the connection that owns the request
(`on_token`, `on_queued`, `on_done`). A chat's fields are checked as its frame is read; its
admission (its model loaded, its prompt built) runs as a task of its own, its id reserved
meanwhile, so the connection reads on: a `cancel` for it (which stops it at once), or any other
frame, is handled while it waits. Conversation frames: websocket/conversations.py. Token text
waiting for a slow reader is coalesced in the outbox, bounded in frames and bytes. Shared: their
cap, each watched model's stats frames (`Connections`). Runs on uvicorn's websocket (transport.py).

Tested in tests/e2e/test_websocket_connection.py; on a fake Frontdoor in
tests/unit/serve/websocket/.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec

from localserve.chat.messages import PromptMessage, ToolCallMade, check_tool_history
from localserve.chat.reply import ReasoningText
from localserve.chat.tool_calls import ContentDelta
from localserve.engine.events import Done
from localserve.ops.auth import address_group, check_user_name, monitor_refusal
from localserve.protocol.frames import (
    CONVERSATION_FRAMES,
    Cancel,
    Chat,
    ClientFrame,
    Error,
    Finished,
    Hello,
    ListModels,
    Queued,
    ReplyUsage,
    Subscribe,
    Timings,
    WireToolCall,
)
from localserve.serve.door import MAX_ERROR_CHARS, Frontdoor, Refusal, Request, Submission
from localserve.serve.tool_use import ReplyReading, ToolUse, tool_use
from localserve.serve.transport import CLOSE_NOT_READING, CLOSE_TIMEOUT_S, client_address
from localserve.serve.websocket import conversations
from localserve.serve.websocket.connections import Connections
from localserve.serve.websocket.outbox import Outbox

log = logging.getLogger("localserve.serve.websocket.connection")

MAX_ID_LENGTH = 128
MAX_ERRORS_BEFORE_HELLO = 3  # then the connection is closed: no guessing, no free echo service
MAX_OUTBOX_FRAMES = 1024  # a client that stops reading is disconnected, not buffered forever
# beside one frame of max_frame_bytes: a conversation sent back is its save frame's content and a
# summary (its title at most 800 bytes)
OUTBOX_SLACK = 4 << 10
MIN_STATS_INTERVAL_MS = 50
HELLO_TIMEOUT_S = 10.0  # a connection that neither says hello nor subscribes is closed
CLOSE_GOING_AWAY = 1001
MAX_REASON_BYTES = 120  # a close frame's reason is at most 123 bytes
FULL = "the server has all the connections it takes (max_connections); try again later"
USER_FULL = (
    "{user!r} holds all the connections one user may (max_connections_per_user = {n}); "
    "close one of them first"
)

_decoder = msgspec.json.Decoder(ClientFrame)


class _IdOnly(msgspec.Struct):
    id: str | None = None
    conversation: _IdOnly | None = None  # a save_conversation's is in its conversation


class Connection:
    """One websocket: its user, its requests, its outbox."""

    def __init__(
        self, door: Frontdoor, connections: Connections, scope, receive, send, num: int
    ) -> None:
        self.door = door
        self.connections = connections
        self.num = num
        self.address = client_address(scope)
        self._receive, self._send = receive, send
        self._transport = scope.get("extensions", {}).get("localserve")
        self.user: str | None = None
        self.requests: dict[str, Request] = {}  # by the client's id
        self._uses: dict[str, ToolUse] = {}  # chats whose replies are read (tools, reasoning)
        self._readings: dict[str, ReplyReading | None] = {}  # made at their first text
        # chats being admitted (model loading, prompt being built): their cancels, by id
        self._submitting: dict[str, asyncio.Event] = {}
        self._submissions: set[asyncio.Task] = set()
        self.outbox = Outbox()
        self.is_closed = False  # nothing more is sent
        self.is_closing = False  # nothing more is read
        self.num_errors_before_hello = 0
        self._stats_task: asyncio.Task | None = None
        self._close_task: asyncio.Future | None = None

    async def run(self) -> None:
        await self._send({"type": "websocket.accept"})
        tasks = [asyncio.create_task(c) for c in (self._write(), self._greet())]
        try:
            while not self.is_closing:
                message = await self._receive()
                if message["type"] == "websocket.disconnect":
                    break
                if message["type"] == "websocket.receive" and not self.is_closing:
                    text = message.get("text")
                    await self._guarded(text if text is not None else message.get("bytes", b""))
        finally:
            if self._close_task is not None:  # the close code the server chose goes out first
                with contextlib.suppress(Exception):
                    await self._close_task
            self.is_closed = self.is_closing = True
            self._cancel_submitting()
            for task in tasks:
                task.cancel()
            if self._stats_task:
                self._stats_task.cancel()
            self.connections.drop(self)

    async def _guarded(self, message: str | bytes) -> None:
        """Handle a frame; whatever goes wrong is an `internal` error, never a dead connection."""
        try:
            await self.handle(message)
        except Exception:
            log.exception("connection %d (%s): handling a frame failed", self.num, self.user)
            self.error("internal", "the server failed to handle this frame (logged)")

    # --- frames out -------------------------------------------------------------------------

    def send(self, frame) -> None:
        if self.is_closed:
            return
        self.outbox.put(frame)
        self._check_backlog()

    def error(
        self, code: str, message: str, client_id: str | None = None, retry_after_s: float = 0.0
    ) -> None:
        """An error frame; it quotes at most MAX_ERROR_CHARS of the client's input."""
        if len(message) > MAX_ERROR_CHARS:
            message = message[:MAX_ERROR_CHARS] + "…"
        if client_id is not None and not 0 < len(client_id) <= MAX_ID_LENGTH:
            client_id = None  # never echo an id the server would not accept
        self.send(Error(code, message, client_id, round(retry_after_s, 1) or None))
        if self.user is None:
            self.num_errors_before_hello += 1
            if self.num_errors_before_hello >= MAX_ERRORS_BEFORE_HELLO:
                self.close(CLOSE_NOT_READING, "too many errors before hello", flush=True)

    def _check_backlog(self) -> None:
        # at least a frame as big as the client may send, and room around it: a conversation it
        # saved can be sent back to it whatever the two settings say
        c = self.door.config
        outbox, limit = self.outbox, max(c.max_outbox_bytes, c.max_frame_bytes + OUTBOX_SLACK)
        if len(outbox) > MAX_OUTBOX_FRAMES:
            self.close(CLOSE_NOT_READING, f"not reading: over {MAX_OUTBOX_FRAMES} frames unsent")
        elif outbox.num_bytes > limit:
            self.close(CLOSE_NOT_READING, f"not reading: over {limit} bytes unsent")

    # the engine's events for this connection's requests (the server routes them here)

    def on_token(self, request: Request, text: str) -> None:
        if self.is_closed:
            return
        reading = self._reading(request)
        if reading is None:
            self.outbox.put_text(request.client_id, text)
        else:
            self._put_events(request.client_id, reading.feed(text))
        self._check_backlog()

    def _reading(self, request: Request) -> ReplyReading | None:
        cid = request.client_id
        if cid not in self._readings:
            use = self._uses.pop(cid, None)
            door = self.door.model(request.model)
            self._readings[cid] = use.reading(door, request.prompt_tail) if use else None
        return self._readings[cid]

    def _put_events(self, client_id: str, events) -> None:
        for event in events:  # the calls go in the done frame, whole
            if isinstance(event, ContentDelta):
                self.outbox.put_text(client_id, event.text)
            elif isinstance(event, ReasoningText):
                self.outbox.put_text(client_id, event.text, reasoning=True)

    def on_queued(self, request: Request, position: int, wait_s: float | None = None) -> None:
        wait_s = None if wait_s is None else round(wait_s, 1)
        self.send(Queued(request.client_id, position, request.loading, wait_s))

    def on_done(self, request: Request, done: Done) -> None:
        if self.requests.get(request.client_id) is request:
            del self.requests[request.client_id]
        reading = self._reading(request)
        self._readings.pop(request.client_id, None)
        calls, finish_reason = [], done.finish_reason
        if reading is not None:
            held, made = reading.finish()
            self._put_events(request.client_id, held)
            calls = [WireToolCall(c.id, c.name, c.arguments) for c in made]
            if calls and finish_reason in ("stop", "length"):
                finish_reason = "tool_calls"
        if done.finish_reason == "error":
            self.error(done.error_code, done.error or "engine error", request.client_id)
        usage = ReplyUsage(done.prompt_tokens, done.completion_tokens, done.cached_tokens)
        timings = Timings.of(done.timings)
        recorded = request.is_recorded
        dropped = request.num_dropped_messages
        self.send(
            Finished(
                request.client_id,
                finish_reason,
                usage,
                timings,
                recorded,
                dropped,
                calls,
                request.model or self.door.model_name,
            )  # fmt: skip
        )

    # --- closing ----------------------------------------------------------------------------

    def close(self, code: int, reason: str, flush: bool = False) -> None:
        """Close now: requests are cancelled at once, the socket within CLOSE_TIMEOUT_S."""
        if self.is_closing:
            return
        self.is_closing = True
        self._log_close(code, reason)
        if not flush:
            self.is_closed = True
            self.connections.drop(self)  # their cells are freed at the next step
            self._cancel_submitting()
        self._close_task = asyncio.ensure_future(self._close(code, reason, flush))

    def _cancel_submitting(self) -> None:
        """The chats still being admitted stop at once; their sink is closed, so admission
        releases them and their tasks end by themselves (submit returns None)."""
        for cancelled in self._submitting.values():
            cancelled.set()

    def _log_close(self, code: int, reason: str) -> None:
        message = f"connection {self.num} ({self.user}, {self.address}): closing, {code}: {reason}"
        place_log = self.connections.place_log
        if code == CLOSE_GOING_AWAY:
            log.info("%s", message)
        elif self.user is None and place_log is not None:  # anyone can cause these, at any rate
            place_log.warning(address_group(self.address), "closed before hello", message, log)
        else:
            log.warning("%s", message)

    async def _close(self, code: int, reason: str, flush: bool) -> None:
        if flush:  # let the client read why (errors before hello), briefly
            await self.flush(CLOSE_TIMEOUT_S / 2)
            self.is_closed = True
        reason = reason.encode()[:MAX_REASON_BYTES].decode(errors="ignore")
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self._send({"type": "websocket.close", "code": code, "reason": reason})
        except TimeoutError:
            self.abort()  # it reads nothing, not even the close frame
        except (OSError, RuntimeError):
            pass  # gone already

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    async def _write(self) -> None:
        timeout = self.door.config.write_timeout_s
        while True:
            data = await self.outbox.get()
            if self.is_closed:
                return
            try:
                async with asyncio.timeout(timeout):
                    await self._send({"type": "websocket.send", "text": data.decode()})
            except TimeoutError:
                return self.close(CLOSE_NOT_READING, f"not reading for {timeout:g} s")
            except (OSError, RuntimeError):  # disconnected, or closed meanwhile
                return

    @property
    def is_silent(self) -> bool:
        """Neither a user's nor a monitor's yet: it counts for no max_connections."""
        return self.user is None and self._stats_task is None

    def _spoke(self) -> None:
        """A user or a monitor now: the transport no longer closes it to make room."""
        if self._transport is not None:
            self._transport.mark_in_use()

    async def _greet(self) -> None:
        """Close a connection that is neither a user's nor a monitor's (it holds a socket)."""
        await asyncio.sleep(HELLO_TIMEOUT_S)
        if self.is_silent:
            self.close(CLOSE_NOT_READING, f"no hello within {HELLO_TIMEOUT_S:g} s")

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
        limit = self.door.config.max_frame_bytes
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
            await self._hello(frame)
        elif isinstance(frame, Subscribe):
            await self._subscribe(frame)
        elif self.user is None:
            self.error("unauthorized", "say hello first", getattr(frame, "id", None))
        elif isinstance(frame, Chat):
            await self._chat(frame)
        elif isinstance(frame, Cancel):
            self._cancel(frame)
        elif isinstance(frame, ListModels):
            self.send(await self.connections.models_frame())
        elif isinstance(frame, CONVERSATION_FRAMES):
            store = self.connections.conversations
            await conversations.answer(self, frame, store, self.connections.others_of)

    async def _hello(self, hello: Hello) -> None:
        if self.user is not None:
            return self.error("bad_request", f"already said hello as {self.user!r}")
        if not check_user_name(hello.user):
            return self.error("bad_request", "user: 1-64 printable characters, no outer spaces")
        access = self.door.access
        allowed = access.allows_user(hello.user, hello.token)
        # unknown names share one key: inventing names must not push real users' entries out
        credential = f"user {hello.user}" if hello.user in access.users else "unknown user"
        refused = await self.door.authenticate(
            self.address, credential, hello.token, allowed, "unknown user or wrong token"
        )
        if self.is_closed:  # it went while the throttle held its hello
            return None
        if refused:
            return self.error("unauthorized", refused.message, None, refused.retry_after_s)
        if self.connections.is_full_for(hello.user):  # before the server's: it says why
            n = self.door.config.connections_per_user
            return self.error("busy", USER_FULL.format(user=hello.user, n=n))
        if self.connections.is_full:
            return self.error("busy", FULL)
        self.user = hello.user
        self._spoke()
        self.send(self.connections.welcome(hello.user))

    async def _subscribe(self, sub: Subscribe) -> None:
        refused = await self.door.authenticate(
            self.address,
            "monitor",
            sub.token,
            self.door.access.allows_monitor(sub.token),
            monitor_refusal("stats need the server's monitor token", sub.token),
        )
        if self.is_closed:
            return None
        if refused:  # an existing subscription goes on
            return self.error("unauthorized", refused.message, None, refused.retry_after_s)
        if sub.interval_ms > 0 and self.is_silent and self.connections.is_full:
            return self.error("busy", FULL)
        try:  # the model's own name (an alias resolved); else, naming the server's, the
            model = None if sub.model is None else self.door.model(sub.model).model_name
        except ValueError as e:  # error, and an existing subscription goes on
            return self.error("bad_request", str(e))
        if self._stats_task:  # this subscribe replaces it
            self._stats_task.cancel()
        self._stats_task = None
        if sub.interval_ms > 0:
            interval = max(sub.interval_ms, MIN_STATS_INTERVAL_MS) / 1e3
            self._stats_task = asyncio.create_task(self._stream_stats(interval, model))
            self._spoke()

    async def _stream_stats(self, interval_s: float, model: str | None) -> None:
        while not self.is_closed:
            try:
                self.outbox.put_stats(await self.connections.stats_frame(model))
            except Exception:  # the engine failed a snapshot: try again at the next tick
                log.exception("connection %d: no stats this time", self.num)
            self._check_backlog()
            await asyncio.sleep(interval_s)

    async def _chat(self, chat: Chat) -> None:
        if not chat.id or len(chat.id) > MAX_ID_LENGTH:
            return self.error("bad_request", f"id: 1-{MAX_ID_LENGTH} characters", chat.id)
        # in flight: still being tokenized, running, or its `done` not sent yet (usage record)
        engine_id = f"{self.num}:{chat.id}"
        mine = chat.id in self.requests or chat.id in self._submitting  # or being admitted
        if self.door.is_in_flight(engine_id) or mine:
            message = f"id {chat.id!r} is already in flight on this connection"
            return self.error("bad_request", message, chat.id)
        try:
            door = self.door.model(chat.model)  # UnknownModel names the server's models
            messages = [_prompt_message(m, i) for i, m in enumerate(chat.messages)]
            check_tool_history(messages)  # its ToolHistoryError names messages[i]'s field
            use = await tool_use(
                door,
                chat.tools,
                chat.tool_choice,
                chat.parallel_tool_calls,
                chat.chat_template_kwargs,
                chat.response_format is not None,
            )
        except ValueError as e:
            return self.error("bad_request", str(e), chat.id)
        cancelled = self._submitting[chat.id] = asyncio.Event()  # the id reserved
        task = asyncio.create_task(self._submit(door, chat, engine_id, messages, use, cancelled))
        self._submissions.add(task)  # held until it ends (the loop keeps only weak references)
        task.add_done_callback(self._submissions.discard)

    async def _submit(
        self,
        door: Frontdoor,
        chat: Chat,
        engine_id: str,
        messages: list[PromptMessage],
        use: ToolUse,
        cancelled: asyncio.Event,
    ) -> None:
        """A chat's admission, while the connection reads on: its `queued` or its `error`
        (a `cancel` meanwhile: its `done` "cancelled", admission's)."""
        try:
            submission = Submission(
                self,
                self.user,
                chat.id,
                engine_id,
                chat,
                lambda prompts, reply: prompts.chat(messages, reply, use.extras),
                chat.response_format,
                constraint=use.constraint,
                cancelled=cancelled,
            )
            request = await door.submit(submission)
        except Refusal as e:
            return self.error(e.code, e.message, chat.id, e.retry_after_s)
        except Exception:
            log.exception("connection %d (%s): admitting a chat failed", self.num, self.user)
            return self.error("internal", "the server failed to admit this chat (logged)", chat.id)
        finally:
            self._submitting.pop(chat.id, None)
        if request is not None and self.door.is_in_flight(engine_id):  # its done not out yet
            self.requests[chat.id] = request
            self._uses[chat.id] = use
            self._readings.pop(chat.id, None)
            if not cancelled.is_set():  # else its `done` comes next, nothing before it
                self.on_queued(request, self.door.num_waiting)

    def _cancel(self, cancel: Cancel) -> None:
        if len(cancel.id) > MAX_ID_LENGTH:
            return self.error("bad_request", f"id: 1-{MAX_ID_LENGTH} characters")
        if (cancelled := self._submitting.get(cancel.id)) is not None:
            return cancelled.set()  # it stops waiting; its `done` "cancelled" follows
        request = self.requests.get(cancel.id)
        if request is None:  # also the answer for another connection's ids: nothing leaks
            return self.error("unknown_id", f"no request {cancel.id!r} in flight here", cancel.id)
        self.door.cancel(request)


def _prompt_message(m, i: int) -> PromptMessage:
    """A chat frame's message for the prompt builder; ValueError naming what is wrong."""
    if m.tool_calls and m.role != "assistant":
        raise ValueError(f"messages[{i}].tool_calls: only an assistant message makes calls")
    if m.role == "tool" and not m.tool_call_id:
        raise ValueError(f"messages[{i}].tool_call_id: a tool message answers a call: its id")
    calls = tuple(ToolCallMade(c.id, c.name, c.arguments) for c in m.tool_calls or ())
    is_tool = m.role == "tool"
    return PromptMessage(
        m.role, m.content, calls, m.tool_call_id if is_tool else None, m.name if is_tool else None
    )


def _recover_id(message: str) -> str | None:
    """The `id` of a frame that failed validation, so the error can name the request."""
    try:
        found = msgspec.json.decode(message, type=_IdOnly)
    except (msgspec.DecodeError, RecursionError):
        return None
    return found.id if found.id is not None or found.conversation is None else found.conversation.id
