"""The terminal chat's `/model` command: which model the next turns talk to.

`/model` alone lists the server's models (the `list_models` frame's answer) with their states
and what choosing each costs now; `/model NAME` makes NAME answer the next turns (the chat
frame's `model`); a name the server does not have is one line naming the ones it has.
`localserve chat --model NAME` starts with NAME.

Tested in tests/unit/tui/test_chat.py and tests/e2e/test_terminal_chat.py.
"""

from __future__ import annotations

from collections.abc import Callable

from localserve.protocol.frames import Error, ListModels, ModelChoice, ModelList
from localserve.websocket_client import Client, ClientError

COMMANDS = (("/model", "list the models; /model NAME: NAME answers from the next turn"),)


class ModelPicker:
    """The model chosen for the next turns (None: the server's default)."""

    def __init__(self, model: str | None, write: Callable[[str], None]) -> None:
        self.model = model
        self._write = write
        self.client: Client | None = None  # set once connected

    def unknown(self, name: str) -> str | None:
        """The line that says `name` is not one of the server's models; None when it is."""
        names = self.client.welcome.models if self.client is not None else []
        if not names or name in names:  # an older server lists none: it says so itself
            return None
        return f"no model {name!r} on this server; it has {', '.join(names)} (/model lists them)"

    async def command(self, text: str) -> bool:
        """`/model` or `/model NAME`: handled (True); any other line is not this one's."""
        word, _, name = text.partition(" ")
        if word != "/model":
            return False
        name = name.strip()
        if not name:
            await self._list()
        elif (refused := self.unknown(name)) is not None:
            self._write(refused)
        else:
            self.model = name
            self._write(f"(the next turns go to {name})")
        return True

    async def _list(self) -> None:
        try:
            models = await list_models(self.client)
        except ClientError as e:
            self._write(f"[error {e.code}: {e.message}]")
            return
        current = self.model or models.default
        width = max(len(m.name) for m in models.models)
        for m in models.models:
            mark = "*" if m.name == current else " "
            default = " (default)" if m.name == models.default else ""
            self._write(f"  {mark} {m.name:{width}}  {choice_text(m)}{default}")


def choice_text(m: ModelChoice) -> str:
    """A model's state and what choosing it costs, in words: "loaded, busy", "unloaded: would
    unload gemma, ~6 s to load", "failed: <why>"."""
    if m.state == "loaded":
        return "loaded, busy" if m.busy else "loaded"
    if m.state == "failed":
        return f"failed: {m.reason}" if m.reason else "failed"
    parts = [m.state + (f" ({m.reason})" if m.reason else "")]
    if m.too_big:
        parts.append("too big for this server's memory")
    elif m.swap:
        waits = ", after their replies" if m.swap_waits else ""
        parts.append(f"would unload {', '.join(m.swap)}{waits}")
    if m.load_s is not None:
        about = "last load" if m.load_s_from == "last_load" else "estimated"
        parts.append(f"~{m.load_s:.0f} s to load ({about})")
    return ": ".join(parts[:1]) + (": " + ", ".join(parts[1:]) if parts[1:] else "")


async def list_models(client: Client) -> ModelList:
    """Ask the server for its models (`list_models`) and return its `models` answer; an error
    without an id (an older server that does not know the frame) raises ClientError. Frames
    about anything else are skipped: one question at a time per client."""
    await client.send(ListModels())
    while True:
        answer = await client.recv()
        if isinstance(answer, ModelList):
            return answer
        if isinstance(answer, Error) and answer.id is None:
            raise ClientError(answer.code, answer.message, answer.retry_after_s)
