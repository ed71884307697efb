"""The engine process's main: load the model, run the engine, obey the pipe until told to stop.

Started by `localserve.engine_process.parent.EngineProcess` as

    python -m localserve.engine_process.child CONN_FD CLOCK_FD LOG_LEVEL LLAMA_LOG_LEVEL PARENT_PID

with the pipe's end and the step clock's file inherited. It reads a `LoadModel`, answers
`Loaded` (or `LoadFailed`), then hands each command it reads to the engine as it comes; the
engine's events and the snapshots asked for go back on the same pipe.

Tested in tests/e2e/test_engine_process.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection

import msgspec

from localserve.engine.client import (
    AddEmbedding,
    AddRequest,
    EngineCommand,
    StopEngine,
    TakeSnapshot,
)
from localserve.engine.engine import Engine
from localserve.engine.events import Done
from localserve.engine_process.messages import (
    EngineEvents,
    EngineMessage,
    Loaded,
    LoadFailed,
    LoadModel,
    SnapshotAnswer,
)
from localserve.engine_process.step_clock import StepClock
from localserve.protocol.snapshot import HostLoad

log = logging.getLogger("localserve.engine_process.child")

Send = Callable[[EngineMessage], None]


def main(conn: Connection, clock_fd: int, level: int, llama_level: int, parent: int) -> None:
    """The child: load the model, run the engine, answer the pipe until told to stop."""
    # Ctrl-C and a service manager's SIGTERM reach the whole process group: the server decides
    # when the engine ends (after its grace period), so the engine ignores both
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(parent)
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")  # an abort would print gdb's attempt
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("llama_cpp").setLevel(llama_level)  # as the server's (cli.py)
    clock = StepClock(clock_fd)

    from localserve.runners.models import open_runner
    from localserve.runners.prefix_disk import open_prefix_tiers
    from localserve.runners.rpc import add_worker

    send = _sender(conn)
    load = msgspec.msgpack.decode(conn.recv_bytes(), type=LoadModel)
    config, name = load.config, load.name
    try:
        for endpoint in config.models[name].rpc_workers:
            add_worker(endpoint)  # an unreachable one aborts this process: the server says so
        runner = open_runner(config, name)
    except Exception as e:
        log.exception("loading %s failed", name)
        send(LoadFailed(str(e)))
        return
    host_cache, disk = open_prefix_tiers(config, name, runner)  # the prefix cache's tiers
    engine = Engine(
        runner,
        config.scheduler,
        on_events=lambda events: send(EngineEvents(events)),
        host_cache_bytes=host_cache,
        disk=disk,
    )
    engine.watch, engine.expect = clock.watch, clock.expect
    engine.start()
    send(Loaded(runner.info, runner.where()))
    _serve_commands(conn, engine, send)


def _sender(conn: Connection) -> Send:
    """What sends a message to the server, from any thread; the process ends with the server."""
    lock = threading.Lock()
    encoder = msgspec.msgpack.Encoder()

    def send(message: EngineMessage) -> None:
        data = encoder.encode(message)
        with lock:
            try:
                conn.send_bytes(data)
            except OSError:  # the server is gone: so are we
                os._exit(0)

    return send


def _serve_commands(conn: Connection, engine: Engine, send: Send) -> None:
    """The engine's commands, one after another, until StopEngine or the server is gone."""
    decoder = msgspec.msgpack.Decoder(EngineCommand)
    host = HostReader()
    while True:
        try:
            command = decoder.decode(conn.recv_bytes())
        except (EOFError, OSError):
            os._exit(0)  # the server is gone
        if isinstance(command, StopEngine):
            engine.stop()
            engine.runner.close()
            os._exit(0)
        elif isinstance(command, TakeSnapshot):
            engine.snapshot().add_done_callback(_answer(send, command.number, host))
        else:
            try:
                engine.submit(command)
            except ValueError as e:  # checked on the server's side first: not expected here
                send(EngineEvents([_refused_done(command, str(e))]))


def _refused_done(add: AddRequest | AddEmbedding, error: str) -> Done:
    """The `done` of a request the engine refused (an internal error: the server checks first)."""
    timings: dict[str, float | None] = {
        "queue_ms": None,
        "ttft_ms": None,
        "itl_ms": None,
        "e2e_ms": 0.0,
    }
    return Done(
        add.request_id,
        "error",
        prompt_tokens=(
            sum(map(len, add.inputs)) if isinstance(add, AddEmbedding) else len(add.prompt_tokens)
        ),
        completion_tokens=0,
        cached_tokens=0,
        timings=timings,
        error=error,
    )


class HostReader:
    """The machine's load around this process: the load average, and the cores this process
    (llama.cpp's threads included) kept busy since the last reading."""

    def __init__(self) -> None:
        self._last = (time.monotonic(), time.process_time())
        self._own: float | None = None  # cores busy, over the last second or more

    def read(self) -> HostLoad | None:
        try:
            load = os.getloadavg()[0]
            cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
        except OSError:  # no load average on this system
            return None
        now, cpu = time.monotonic(), time.process_time()
        wall = now - self._last[0]
        if wall >= 1.0:  # a rate over less is noise; keep the last one
            self._own = (cpu - self._last[1]) / wall
            self._last = (now, cpu)
        if self._own is None:  # no rate of its own yet: the others' share is not known
            return None
        return HostLoad(cpus=cpus or os.cpu_count() or 1, load_1m=load, own_cores=self._own)


def _answer(send: Send, number: int, host: HostReader) -> Callable[[Future], None]:
    """The callback that sends a snapshot's Future's outcome back as a SnapshotAnswer, with the
    machine's load."""

    def answer(future: Future) -> None:
        try:
            snapshot = msgspec.structs.replace(future.result(), host=host.read())
            send(SnapshotAnswer(number, snapshot))
        except Exception as e:
            send(SnapshotAnswer(number, None, str(e)))

    return answer


def _die_with_parent(parent: int) -> None:
    """Linux: the engine process gets SIGKILL when the server's process ends, however it ends
    (strictly: when the server's thread that started it ends; the watchdog outlives it)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    # the parent died before the line above: we were handed to another (init, a subreaper).
    # Not `getppid() == 1`: the server itself is PID 1 as a container's entrypoint
    if os.getppid() != parent:
        os._exit(0)


if __name__ == "__main__":
    main(Connection(int(sys.argv[1])), *map(int, sys.argv[2:6]))
