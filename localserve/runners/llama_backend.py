"""llama.cpp's process-wide set-up, done once when a runner module is first imported: its log
lines routed into Python logging (and kept while a model loads: they say where each layer
went), and its backend initialised.

Tested in tests/e2e/test_llama_runner.py.
"""

from __future__ import annotations

import ctypes
import logging

import llama_cpp

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


router = LogRouter()
llama_cpp.llama_log_set(router.callback, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()
