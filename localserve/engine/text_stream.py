"""A sequence's text as it streams: incremental UTF-8 decoding of token pieces, stop strings,
and the leading space a chat format's reply may start with."""

from __future__ import annotations

import codecs


class TextStream:
    """Incremental UTF-8 decoding with stop strings: holds back text that may begin a stop.

    With `strip_space`, a space that the first text released starts with is dropped (after the
    stop strings have seen it: they match the model's text as it is).
    """

    def __init__(self, stop: tuple[str, ...], strip_space: bool = False) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = stop
        self._pending = ""
        self._strip_space = strip_space  # until the first text is released
        self.text = ""  # everything released so far
        self.stop_hit = ""  # the stop string that ended the stream ("" when none did)

    def push(self, piece: bytes) -> tuple[str, bool]:
        """Add a token's bytes; return (text safe to release, whether a stop string was hit)."""
        self._pending += self._decoder.decode(piece)
        if not self._stop:
            return self._release(len(self._pending)), False
        hits = [i for i in (self._pending.find(s) for s in self._stop) if i >= 0]
        if hits:
            at = min(hits)
            self.stop_hit = next(s for s in self._stop if self._pending.find(s) == at)
            delta = self._release(at)
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
        if self._strip_space and out:
            self._strip_space = False
            out = out.removeprefix(" ")
        self.text += out
        return out
