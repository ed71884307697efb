"""The access log: one line per finished request, plain or JSON, in a file rotated by size.

`[server] access_log` says where ("auto": `access.log` in the state directory, and only off
loopback; "off"; or a path), `access_log_format` how ("plain" or "json"). The usage record's
writer thread writes the lines (ops/usage.py), so a slow disk never stalls the event loop.
The user and the request id are the client's words: quoted, so a line stays one line.

Tested through the server in tests/e2e/test_usage_record.py.
"""

from __future__ import annotations

import datetime
import json
import logging
import logging.handlers
import os
from pathlib import Path
from typing import Any

from localserve.config import ConfigError, ServerConfig
from localserve.ops.auth import is_loopback

log = logging.getLogger("localserve.ops.usage")  # the usage record's logger: its writer's

ACCESS_LOG = "access.log"
TIMINGS = ("queue_ms", "ttft_ms", "e2e_ms")


class AccessLog:
    """An open access log; `write` a finished request's usage row (its fields, by name)."""

    def __init__(self, path: Path, logger: logging.Logger, is_json: bool) -> None:
        self.path = path
        self._logger = logger
        self._is_json = is_json

    @classmethod
    def open(cls, config: ServerConfig, state_dir: Path, host: str) -> AccessLog | None:
        """The log [server] access_log asks for on a server listening on `host`; None when
        off. ConfigError naming the file when it cannot be opened."""
        setting = config.access_log
        if setting == "off" or (setting == "auto" and is_loopback(host)):
            return None
        path = state_dir / ACCESS_LOG if setting == "auto" else Path(setting).expanduser()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.handlers.RotatingFileHandler(
                path,
                maxBytes=config.access_log_max_bytes,
                backupCount=config.access_log_backups,
                encoding="utf-8",
            )
            os.chmod(path, 0o600)
        except OSError as e:
            raise ConfigError(f"{path}: cannot open the access log: {e}") from None
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger = logging.getLogger(f"localserve.access.{id(handler)}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        return cls(path, logger, config.access_log_format == "json")

    def write(self, row: dict[str, Any]) -> None:
        """The row's line; a failure is logged, never raised (the row is recorded anyway)."""
        try:
            self._logger.info(self._line(row))
        except Exception:
            log.exception("access log: %s", row.get("request_id"))

    def _line(self, row: dict[str, Any]) -> str:
        when = datetime.datetime.fromtimestamp(row["finished"]).astimezone()
        stamp = when.isoformat(timespec="milliseconds")
        if self._is_json:
            return json.dumps({"time": stamp} | row, ensure_ascii=False)
        timings = " ".join(f"{k}={_ms(row[k])}" for k in TIMINGS)
        user, request = (json.dumps(row[k], ensure_ascii=False) for k in ("user", "request_id"))
        return (
            f"{stamp} {user} {request} {row['api']} "
            f"{row['model']} {row['finish_reason']} prompt={row['prompt_tokens']} "
            f"cached={row['cached_tokens']} completion={row['completion_tokens']} {timings}"
        )

    def close(self) -> None:
        for handler in self._logger.handlers:
            handler.close()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
