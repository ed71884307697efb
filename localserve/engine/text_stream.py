"""A sequence's text as it streams: incremental UTF-8 decoding of token pieces, stop strings."""

from __future__ import annotations

import codecs


class TextStream:
    """Incremental UTF-8 decoding with stop strings: holds back text that may begin a stop."""

    def __init__(self, stop: tuple[str, ...]) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = stop
        self._pending = ""
        self.text = ""  # everything released so far

    def push(self, piece: bytes) -> tuple[str, bool]:
        """Add a token's bytes; return (text safe to release, whether a stop string was hit)."""
        self._pending += self._decoder.decode(piece)
        if not self._stop:
            return self._release(len(self._pending)), False
        hits = [i for i in (self._pending.find(s) for s in self._stop) if i >= 0]
        if hits:
            delta = self._release(min(hits))
            self._pending = ""
            return delta, True
        return self._release(len(self._pending) - self._held_back()), False

    def flush(self) -> str:
        """Release everything held back (the sequence ended without a stop string)."""
        self._pending += self._decoder.decode(b"", final=True)
        return self._release(len(self._pending))

    def _held_back(self) -> int:
        """Length of the longest suffix of pending text that is a proper prefix of a stop."""
        p = self._pending
        for n in range(min(len(p), max(map(len, self._stop)) - 1), 0, -1):
            if any(s.startswith(p[-n:]) for s in self._stop):
                return n
        return 0

    def _release(self, n: int) -> str:
        out, self._pending = self._pending[:n], self._pending[n:]
        self.text += out
        return out
