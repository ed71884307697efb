"""What crosses the pipe between the server's process and the engine process (msgpack).

Server -> engine: first a `LoadModel`, then the engine's own commands
(`localserve.engine.client.EngineCommand`: the same structs `Engine` handles in-process).
Engine -> server: `Loaded` or `LoadFailed` once, then `EngineEvents` and `SnapshotAnswer`s.

Tested in tests/e2e/test_engine_process.py.
"""

from __future__ import annotations

import msgspec

from localserve.config import Config
from localserve.engine.events import Event
from localserve.protocol.snapshot import ModelInfo, Snapshot

# --- server -> engine --------------------------------------------------------------------------


class LoadModel(msgspec.Struct):
    """The first message: what to load."""

    config: Config
    name: str  # the model's name in the config


# --- engine -> server --------------------------------------------------------------------------


class Loaded(msgspec.Struct, tag=True):
    info: ModelInfo
    where: str  # the start-up block's lines


class LoadFailed(msgspec.Struct, tag=True):
    message: str  # loading failed in Python (a missing file, a context llama.cpp refused)


class EngineEvents(msgspec.Struct, tag=True):
    """One step's events, as the engine's `on_events` got them."""

    events: list[Event]


class SnapshotAnswer(msgspec.Struct, tag=True):
    """The answer to a TakeSnapshot: its number, and the snapshot or why there is none."""

    number: int
    snapshot: Snapshot | None
    error: str = ""


EngineMessage = Loaded | LoadFailed | EngineEvents | SnapshotAnswer
