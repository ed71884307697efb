"""The stream writer: frames waiting for one websocket, bounded in frames and in bytes.

Frames are encoded when they are queued, so `num_bytes` is what they hold. Token text for a
request is merged into one waiting frame (a slow reader gets fewer, larger frames, never more
of them), its reasoning beside its text (a reply's reasoning all comes before its answer); only
the newest stats frame is kept.
"""

from __future__ import annotations

import asyncio
from collections import deque

import msgspec

from localserve.protocol.frames import TokenDelta

_encoder = msgspec.json.Encoder()


_TOKEN_FRAME_BYTES = len(_encoder.encode(TokenDelta("", "")))  # without its id and text
_REASONING_FIELD_BYTES = len(b',"reasoning":""')


class _OpenText:
    """A token frame still open for more text, and the bytes counted for it."""

    __slots__ = ("frame", "num_bytes")

    def __init__(self, frame: TokenDelta, num_bytes: int) -> None:
        self.frame = frame
        self.num_bytes = num_bytes


class _Slot:
    """An encoded frame that a newer one may replace while it waits (stats)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class Outbox:
    """Frames waiting to be written, counted in frames and in bytes."""

    def __init__(self) -> None:
        self._frames: deque[bytes | _OpenText | _Slot] = deque()
        self._open_text: dict[str, _OpenText] = {}
        self._stats: _Slot | None = None
        self._ready = asyncio.Event()
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._frames)

    def put(self, frame) -> None:
        data = _encoder.encode(frame)
        self._push(data, len(data))

    def put_text(self, client_id: str, text: str, reasoning: bool = False) -> None:
        """Reply text (or reasoning) for a request, merged into its waiting frame if any."""
        size = len(_encoder.encode(text)) - 2  # as JSON (escapes included), less the quotes
        pending = self._open_text.get(client_id)
        if pending is not None:  # coalesce: the client has not read the last delta yet
            if reasoning:
                size += 0 if pending.frame.reasoning else _REASONING_FIELD_BYTES
                pending.frame.reasoning += text
            else:
                pending.frame.text += text
            pending.num_bytes += size
            self.num_bytes += size
            return
        frame = TokenDelta(client_id, "", text) if reasoning else TokenDelta(client_id, text)
        size += _TOKEN_FRAME_BYTES + len(client_id.encode())
        size += _REASONING_FIELD_BYTES if reasoning else 0
        self._open_text[client_id] = pending = _OpenText(frame, size)
        self._push(pending, size)

    def put_stats(self, data: bytes) -> None:
        """An encoded stats frame; only the newest snapshot is worth sending."""
        if self._stats is None:
            self._stats = _Slot(data)
            self._push(self._stats, len(data))
        else:
            self.num_bytes += len(data) - len(self._stats.data)
            self._stats.data = data

    def _push(self, item: bytes | _OpenText | _Slot, num_bytes: int) -> None:
        self._frames.append(item)
        self.num_bytes += num_bytes
        self._ready.set()

    async def get(self) -> bytes:
        while not self._frames:
            self._ready.clear()
            await self._ready.wait()
        item = self._frames.popleft()
        if isinstance(item, _OpenText):
            del self._open_text[item.frame.id]
            self.num_bytes -= item.num_bytes
            return _encoder.encode(item.frame)
        if isinstance(item, _Slot):
            self._stats = None
            item = item.data
        self.num_bytes -= len(item)
        return item

    @property
    def is_empty(self) -> bool:
        return not self._frames
