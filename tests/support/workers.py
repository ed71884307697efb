"""`localserve worker` processes on free loopback ports, for the tests of a split model."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

LOCALSERVE = [sys.executable, "-m", "localserve"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    """`localserve worker` on a free loopback port, until closed."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.proc = subprocess.Popen(
            [*LOCALSERVE, "worker", "--port", str(self.port), "--cache-dir", "off"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 60
        for line in self.proc.stdout:
            if "lending CPU" in line:
                break
            assert time.monotonic() < deadline, "the worker did not start"
        else:
            raise AssertionError(f"the worker exited: {self.proc.wait()}")
        self.endpoint = f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.proc.stdout.close()
