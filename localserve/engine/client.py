"""The engine's interface: what the server and its front-ends need of an engine, and its commands.

`EngineClient` is what `localserve.serve` depends on. Two classes implement it: the engine on a
thread of this process (`localserve.engine.engine.Engine`) and the engine in a supervised process
of its own (`localserve.engine_process.parent.EngineProcess`). Both inherit the request entry
points written here (`add_request`, `cancel`, `reject`), which become commands handed to
`submit`. `add_embedding` queues an embedding request (localserve.engine.embedding).

The commands are one typed set of msgspec structs: `Engine` handles them on its thread and the
engine process sends the same structs over its pipe (msgpack), where its child hands them on
to the engine as they come.

Tested in tests/unit/engine/test_engine.py.
"""

from __future__ import annotations

from abc import abstractmethod
from concurrent.futures import Future
from typing import Protocol, Self, runtime_checkable

import msgspec

from localserve.engine.events import EventSink
from localserve.engine.sampling_params import SamplingParams
from localserve.protocol.snapshot import Snapshot


class EngineUnavailable(RuntimeError):
    """The engine process is down (llama.cpp aborted, a worker is gone) or restarting."""


# --- the commands --------------------------------------------------------------------------------


class AddRequest(msgspec.Struct, tag=True, array_like=True):
    """Queue a request. `system_tokens`: the prompt starts with a system prompt of this many
    tokens that other requests may share (the user's own, or every user's with
    `system_is_global`). `client_id`: the id its client knows it by, for the monitor (None: the
    request id)."""

    request_id: str
    prompt_tokens: list[int]
    params: SamplingParams
    user: str = ""
    system_tokens: int = 0
    system_is_global: bool = False
    client_id: str | None = None


class AddEmbedding(msgspec.Struct, tag=True, array_like=True):
    """Queue an embedding request: one vector per input (token ids), in order. `client_id`:
    as AddRequest's."""

    request_id: str
    inputs: list[list[int]]
    user: str = ""
    client_id: str | None = None


class CancelRequest(msgspec.Struct, tag=True, array_like=True):
    """Cancel a request at the next step (also mid-prefill); unknown or finished ids are
    ignored."""

    request_id: str


class CountRejection(msgspec.Struct, tag=True, array_like=True):
    """Count a request the server turned away (busy, too long, ...)."""


class TakeSnapshot(msgspec.Struct, tag=True, array_like=True):
    """Build a snapshot between two steps. `number`: the asker's, carried back with the answer
    (the engine process's; in-process the answer goes to a Future)."""

    number: int = 0


class StopEngine(msgspec.Struct, tag=True, array_like=True):
    """Stop the engine thread (in-flight requests are left as they are)."""


RequestCommand = AddRequest | AddEmbedding | CancelRequest | CountRejection
EngineCommand = (
    AddRequest | AddEmbedding | CancelRequest | CountRejection | TakeSnapshot | StopEngine
)


# --- the interface -------------------------------------------------------------------------------


@runtime_checkable
class EngineClient(Protocol):
    """An engine as the server uses it: requests in, events out, snapshots on demand.

    Every method is thread-safe. Events go to `on_events`, one list per step, called on one of
    the engine's threads; the server sets it before `start()`.
    """

    problem: str  # why it does not serve ("" while it does)
    on_events: EventSink

    @abstractmethod
    def submit(self, command: RequestCommand) -> None:
        """Hand a command to the engine. An AddRequest raises ValueError (an empty, too long or
        duplicate request; a chat to an embedding-only model) or EngineUnavailable (the engine
        process is down); an AddEmbedding raises them too (localserve.engine.embedding's
        check_embedding says which inputs are refused)."""

    def add_request(
        self,
        request_id: str,
        prompt_tokens: list[int],
        params: SamplingParams,
        user: str = "",
        system_tokens: int = 0,
        system_is_global: bool = False,
        client_id: str | None = None,
    ) -> None:
        """Queue a request (AddRequest says what each argument means)."""
        self.submit(
            AddRequest(
                request_id, prompt_tokens, params, user, system_tokens, system_is_global, client_id
            )
        )

    def add_embedding(
        self,
        request_id: str,
        inputs: list[list[int]],
        user: str = "",
        client_id: str | None = None,
    ) -> None:
        """Queue an embedding request (AddEmbedding says what each argument means); its events
        are Embedded, then Done."""
        self.submit(AddEmbedding(request_id, inputs, user, client_id))

    def cancel(self, request_id: str) -> None:
        """Cancel at the next step (also mid-prefill); unknown or finished ids are ignored."""
        self.submit(CancelRequest(request_id))

    def reject(self) -> None:
        """Count a request the server turned away (busy, too long, ...)."""
        self.submit(CountRejection())

    @abstractmethod
    def snapshot(self) -> Future[Snapshot]:
        """A Future of the engine's next snapshot, built between two steps."""

    @abstractmethod
    def start(self) -> Self:
        """Start serving (load the model, start the threads); returns itself."""

    @abstractmethod
    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (requests in flight are left as they are)."""
