"""llama.cpp's process-wide set-up, done once when a runner module is first imported: its log
lines routed into Python logging (and kept while a model loads: they say where each layer
went), and its backend initialised; and the llama_batch both runners fill through numpy.

Tested in tests/e2e/test_llama_runner.py.
"""

from __future__ import annotations

import ctypes
import logging

import llama_cpp
import numpy as np

llama_log = logging.getLogger("llama_cpp")

# ggml's log levels (1 debug .. 4 error); its INFO is model-loading chatter, so it goes to DEBUG
_LOG_LEVELS = {0: logging.DEBUG, 1: 5, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}


class LogRouter:
    """Route llama.cpp's log lines into Python logging (it writes to stderr otherwise)."""

    def __init__(self) -> None:
        self._buffer = ""
        self._level = logging.DEBUG
        self.captured: list[str] | None = None  # lines kept while a model loads (placement)
        self.callback = llama_cpp.llama_log_callback(self._on_log)  # keep a reference

    def _on_log(self, level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        if level != 5:  # 5 = continuation of the previous line
            self._level = _LOG_LEVELS.get(level, logging.INFO)
        self._buffer += text.decode("utf-8", errors="replace")
        while "\n" in self._buffer:
            line, self._buffer = self._buffer.split("\n", 1)
            if line.strip():
                llama_log.log(self._level, line)
                if self.captured is not None:
                    self.captured.append(line)


class LlamaBatch:
    """A llama_batch of `n` tokens (one sequence each) whose arrays numpy fills in place:
    `tok`, `pos`, `logits`, and `seq` (every token's seq_id list is pointed at one contiguous
    array, so numpy can fill it; the original addresses are restored before freeing)."""

    def __init__(self, n: int) -> None:
        self.batch = b = llama_cpp.llama_batch_init(n, 0, 1)
        self.tok = np.ctypeslib.as_array(b.token, shape=(n,))
        self.pos = np.ctypeslib.as_array(b.pos, shape=(n,))
        self.logits = np.ctypeslib.as_array(b.logits, shape=(n,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(n,))[:] = 1
        self.seq = np.zeros(n, dtype=np.int32)
        # as ints: indexing gives views
        self._seq_addrs = [ctypes.cast(b.seq_id[i], ctypes.c_void_p).value for i in range(n)]
        self._point_seq_ids([self.seq.ctypes.data + 4 * i for i in range(n)])

    def _point_seq_ids(self, addrs: list[int]) -> None:
        ptr = ctypes.POINTER(llama_cpp.llama_seq_id)
        for i, addr in enumerate(addrs):
            self.batch.seq_id[i] = ctypes.cast(addr, ptr)

    def free(self) -> None:
        self._point_seq_ids(self._seq_addrs)
        llama_cpp.llama_batch_free(self.batch)


router = LogRouter()
llama_cpp.llama_log_set(router.callback, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()
