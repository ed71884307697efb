"""The terminal chat's conversations kept on the server: /chats, /resume, each turn saved.

On a server that keeps its people's conversations (the welcome's `conversations: true`: a server
with users), `localserve chat` saves every finished turn there in the form the chat page saves
its own (localserve/serve/web/app.js: a title from the first question's first line, each
message's status, finish, usage, timings and reasoning, from the revision it was made of), so
the page lists the terminal's conversations and the terminal resumes the page's. `/chats` lists
them newest first (by when they were started, as the page does), 20 a page; `/resume N` or
`/resume ID` loads one, prints its last turns and goes on with it.

A save refused with `conflict` (another device saved the conversation meanwhile) keeps this
terminal's copy as a conversation of its own, titled "… (this device)" as the page does, and the
chat goes on in it: the turns typed here are not lost and the other device's are not overwritten
(merging them would give the model a history it never answered). A save the store refuses
(`not_saved`: the person's bound, a full disk) is said in one line; the terminal keeps every turn
and sends the whole conversation again with the next one.

Tested in tests/unit/tui/test_server_chats.py and tests/e2e/test_terminal_conversations.py.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TextIO

import msgspec

from localserve.protocol.frames import (
    CONVERSATION_ID,
    MAX_TITLE_CHARS,
    ConversationSummary,
    Finished,
    GetConversation,
    ListConversations,
    Message,
    SaveConversation,
    SavedConversation,
    StoredMessage,
)
from localserve.websocket_client import Client, ClientError, ConnectionClosed, stored
from tui.model_picker import ModelPicker

PAGE_SIZE = 20  # conversations a /chats shows (the server's list frame pages by 100)
NUM_SHOWN = 4  # messages printed when a conversation is resumed: its last two turns
MAX_SHOWN_LINES = 8  # of each of them
MAX_SHOWN_CHARS = 600
MAX_TITLE_SHOWN = 48
TITLE_CHARS = 60  # a new conversation's title: its first question's first line, as the page cuts
STORE_TIMEOUT_S = 30.0
NOT_KEPT = "this server keeps no conversations (it has no users): /chats and /resume need one"
COMMANDS = (
    ("/chats", "list your conversations kept on the server, newest first (/chats 2: the next)"),
    ("/resume", "/resume N (a number from /chats) or ID: go on with that conversation"),
)
_NUMBER = re.compile(r"[0-9]+")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # escapes too: stored text is not ours
_encode = msgspec.json.Encoder().encode


@dataclass
class OpenConversation:
    """The conversation this terminal is in, as the server keeps it."""

    id: str
    title: str
    created: int  # ms since the epoch
    messages: list[StoredMessage] = field(default_factory=list)
    revision: int | None = None  # the stored revision this copy is of; None: never saved
    model: str | None = None  # the model it talks to, as the page keeps it (None: the default)


class ServerChats:
    """Lists, resumes and saves the person's conversations over the chat's connection."""

    def __init__(self, history: list[Message], write, picker: ModelPicker) -> None:
        self.history = history  # the chat client's: replaced in place by a resume
        self.picker = picker  # the model of the next turns: set by a resume, saved with a turn
        self._write = write  # print-like: write(text, file=None)
        self.client: Client | None = None
        self.current: OpenConversation | None = None
        self._shown: dict[int, str] = {}  # the numbers of the last /chats: number -> id

    @property
    def is_kept(self) -> bool:
        welcome = self.client.welcome if self.client is not None else None
        return bool(welcome and welcome.conversations)

    async def command(self, text: str) -> bool:
        """/chats or /resume: done here (True); any other command is not ours (False)."""
        word, _, arg = text.partition(" ")
        if word not in ("/chats", "/resume"):
            return False
        if not self.is_kept:
            self._write(NOT_KEPT)
        elif word == "/chats":
            await self.show_list(arg.strip())
        else:
            await self.resume(arg.strip())
        return True

    def new(self) -> None:
        """/new: the next turn starts a conversation of its own."""
        self.current = None

    # --- /chats ---

    async def show_list(self, arg: str) -> None:
        page = _number(arg or "1")
        if page is None:
            return self._write(f"/chats takes a page number (1, 2, ...), not {_shown(arg)!r}")
        found = await self._ask(ListConversations((page - 1) * PAGE_SIZE))
        if found is None:
            return
        if not found.conversations:
            return self._write(_none_line(found.total, page))
        now = datetime.now()
        here = self.current.id if self.current else None
        for num, summary in enumerate(found.conversations[:PAGE_SIZE], found.offset + 1):
            self._shown[num] = summary.id
            self._write(summary_line(num, summary, now, summary.id == here))
        last = found.offset + min(PAGE_SIZE, len(found.conversations))
        more = f"; /chats {page + 1} for more" if last < found.total else ""
        self._write(f"({found.offset + 1}–{last} of {found.total}{more}; /resume N goes on with N)")

    # --- /resume ---

    async def resume(self, ref: str, file: TextIO | None = None) -> bool:
        """Load the conversation `ref` names (a number from /chats, an id; "" the newest), show
        where it stands and make it this chat's. False, said in one line, when it cannot."""
        if not self.is_kept:
            self._fail(NOT_KEPT, file)
            return False
        id = await self._resolve(ref or "1", file)
        found = await self._ask(GetConversation(id), file) if id else None
        if found is None:
            return False
        got = found.conversation
        self.current = OpenConversation(
            got.id, got.title, got.created, list(got.messages), found.summary.revision, got.model
        )
        self.history[:] = history_of(got.messages)
        when = _when(found.summary.updated, datetime.now())
        num = len(got.messages)
        on = self._take_model(got.model)
        self._write(f"(resumed “{_title(got.title)}”: {_messages(num)}, last saved {when}{on})")
        for line in recent(got.messages):
            self._write(line)
        return True

    def _take_model(self, model: str | None) -> str:
        """A resumed conversation goes on with its model, as in the page, when the server
        still has it; what to add to the resume's line."""
        if model is None or model == self.picker.model:
            return ""
        if self.picker.unknown(model):
            return f"; its model {_shown(model)} is gone, so {self._model_now()} answers"
        self.picker.model = model
        return f", on {model}"

    def _model_now(self) -> str:
        return self.picker.model or self.client.welcome.model

    async def _resolve(self, ref: str, file: TextIO | None) -> str | None:
        """The id `ref` names: its number in the last /chats, else in the list now; or itself."""
        if not _NUMBER.fullmatch(ref):
            if re.fullmatch(CONVERSATION_ID, ref):
                return ref
            why = "a number from /chats or a conversation id (letters, digits, _ and -)"
            self._fail(f"/resume takes {why}, not {_shown(ref)!r}", file)
            return None
        num = _number(ref)
        if num in self._shown:
            return self._shown[num]
        found = await self._ask(ListConversations(num - 1), file) if num else None
        if found is not None and found.conversations:
            return found.conversations[0].id
        if found is not None and not found.total:
            self._fail("you have no conversations on the server yet", file)
        elif found is not None or num is None:
            total = f"you have {found.total}" if found is not None else "/chats lists yours"
            self._fail(f"no conversation {_shown(ref)} on the server ({total})", file)
        return None

    # --- each turn saved ---

    async def turn(self, question: str, answer: str, thought: str, done: Finished, stopped: bool):
        """A finished turn: added to the conversation, which is saved whole."""
        if not self.is_kept:
            return
        if self.current is None:
            self.current = OpenConversation(new_id(), title_of(question), _now_ms())
        self.current.model = self.picker.model
        user = StoredMessage("user", question)
        self.current.messages += [user, reply_message(answer, thought, done, stopped)]
        await self.save()

    async def save(self) -> None:
        c = self.current
        frame = SaveConversation(
            SavedConversation(c.id, c.title, c.created, c.messages, c.model), c.revision
        )
        limit = self.client.welcome.limits.max_frame_bytes
        if len(_encode(frame)) > limit:
            return self._write(
                f"[not saved on the server: this conversation is longer than it takes "
                f"({limit >> 10} KiB); /new starts another]"
            )
        try:
            saved = await self._ask(frame)
        except ClientError:  # conflict: another device saved it since this copy was made
            return await self._keep_as_copy()
        if saved is not None:
            c.revision = saved.summary.revision

    async def _keep_as_copy(self) -> None:
        old = self.current
        title = f"{old.title} (this device)"[:MAX_TITLE_CHARS]
        self.current = OpenConversation(new_id(), title, old.created, old.messages, None, old.model)
        self._write(
            f"[“{_title(old.title)}” was changed on another device meanwhile: this terminal's "
            f"copy is kept as “{_title(title)}”, and goes on there (/chats lists both)]"
        )
        await self.save()  # a new conversation: no revision, no conflict

    async def _ask(self, frame, file: TextIO | None = None):
        """The store's answer, or None with the reason said in one line; a conflict raises."""
        try:
            async with asyncio.timeout(STORE_TIMEOUT_S):
                return await stored(self.client, frame)
        except ClientError as e:
            if e.code == "conflict":
                raise
            self._fail(e.message, file, server=True)
        except TimeoutError:
            self._fail(f"the server did not answer in {STORE_TIMEOUT_S:.0f} s", file, True)
        except (ConnectionClosed, OSError) as e:
            self._fail(f"connection lost: {e}", file, server=True)
        return None

    def _fail(self, text: str, file: TextIO | None, server: bool = False) -> None:
        """Why a command could not be done, in one line: in the chat (the server's words in
        brackets, as its other errors), or for --resume on `file` (standard error) as a slip."""
        if file is not None:
            self._write(f"localserve chat: --resume: {text}", file=file)
        else:
            self._write(f"[{text}]" if server else text)


def history_of(messages: list[StoredMessage]) -> list[Message]:
    """What the model is sent again of a stored conversation, as the page sends it: every
    question, and the replies that finished or were stopped (not failed ones, nor reasoning)."""
    return [
        Message(m.role, m.content)
        for m in messages
        if m.role == "user" or (m.content and m.status in ("done", "stopped"))
    ]


def reply_message(answer: str, thought: str, done: Finished, stopped: bool) -> StoredMessage:
    """A reply as the page stores it: its status from how it ended (app.js's finish())."""
    status, error = "done", None
    if done.finish_reason == "error":
        status = "error"
    elif done.finish_reason == "cancelled":
        status = "stopped" if stopped else "interrupted"
        error = None if stopped else "the server ended this reply early (it is stopping)"
    return StoredMessage(
        "assistant",
        answer,
        status=status,
        error=error,
        finish=done.finish_reason,
        usage=done.usage,
        timings=done.timings,
        reasoning=thought or None,
        model=done.model or None,
    )


def title_of(question: str) -> str:
    """A new conversation's title, as the page makes it: the first line, 60 characters."""
    return question.strip().split("\n")[0][:TITLE_CHARS] or "New chat"


def new_id() -> str:
    """A conversation id of the page's form: c, the time in base 36, 8 hex digits."""
    ms, digits = _now_ms(), ""
    while ms:
        ms, d = divmod(ms, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[d] + digits
    return f"c{digits}{secrets.token_hex(4)}"


def summary_line(num: int, s: ConversationSummary, now: datetime, here: bool = False) -> str:
    """One conversation in /chats: its number, title, when it was last saved, its size."""
    mark = "*" if here else " "
    size = f"{max(1, round(s.bytes / 1024))} KiB"
    return f"{mark}{num:3}. {_title(s.title):{MAX_TITLE_SHOWN}}  {_when(s.updated, now)} · {size}"


def recent(messages: list[StoredMessage]) -> list[str]:
    """The last messages of a resumed conversation, as the chat prints them, each cut short."""
    lines = []
    if len(messages) > NUM_SHOWN:
        lines.append(f"  ({_messages(len(messages) - NUM_SHOWN)} before these)")
    for m in messages[-NUM_SHOWN:]:
        who = "you> " if m.role == "user" else "model> "
        text = m.content or f"({m.status or 'no reply'}{': ' + m.error if m.error else ''})"
        lines.append(who + _cut(text))
    return lines


def _cut(text: str) -> str:
    text = _CONTROL.sub("?", text.replace("\t", "    ").strip())
    kept = text[:MAX_SHOWN_CHARS].split("\n")[:MAX_SHOWN_LINES]
    shown = "\n".join(kept)
    return shown + " […]" if len(shown) < len(text) else shown


def _title(title: str) -> str:
    title = _CONTROL.sub(" ", title.replace("\n", " ")).strip() or "New chat"
    return title if len(title) <= MAX_TITLE_SHOWN else title[: MAX_TITLE_SHOWN - 1] + "…"


def _shown(text: str) -> str:
    """A person's input, quoted back: one line, not all of a paste."""
    text = _CONTROL.sub("?", text)
    return text if len(text) <= 40 else text[:39] + "…"


def _none_line(total: int, page: int) -> str:
    if not total:
        return "(no conversations on the server yet: the next turn starts one)"
    pages = -(-total // PAGE_SIZE)
    return f"(no page {page}: your {_conversations(total)} fill {pages} of {PAGE_SIZE} each)"


def _number(text: str) -> int | None:
    """A positive number as a person types it (1, 2, ...), None for anything else."""
    if not _NUMBER.fullmatch(text) or len(text) > 8 or int(text) == 0:
        return None
    return int(text)


def _when(ms: int, now: datetime) -> str:
    at = datetime.fromtimestamp(ms / 1000)
    if at.date() == now.date():
        return f"today {at:%H:%M}"
    if at.date() == (now - timedelta(days=1)).date():
        return f"yesterday {at:%H:%M}"
    return f"{at:%Y-%m-%d %H:%M}"


def _messages(n: int) -> str:
    return f"{n} message{'' if n == 1 else 's'}"


def _conversations(n: int) -> str:
    return f"{n} conversation{'' if n == 1 else 's'}"


def _now_ms() -> int:
    return int(time.time() * 1000)
