"""The server's side of the engine process: `EngineProcess`, an `EngineClient`, and its watchdog.

`EngineProcess` starts the engine process (`localserve.engine_process.child`), sends it the
engine's commands and hands on what it sends back: events to `on_events`, snapshots to the
Futures that asked for them. It keeps its own account of each request in flight, so that when
the process dies every one of them still gets its `done`. `Vocabulary` is the runner's text
side here: prompts are tokenized in the server's process, with a vocabulary-only load of the
model, and only token ids cross.

Its watchdog (a thread of its own) reads the step clock the engine writes, hears the engine's
answers, and takes the engine down and up again: it acts on the process's state under the same
lock as the entry points and the reader, so it lives beside them, in this class. A snapshot the
engine, busy in a step, has not given within ANSWER_S is the last one with that step added
(`Snapshot.step`): /healthz, /metrics and the stats frames never wait for a long step.

Its verdict on each look is watchdog.py's `watchdog_verdict`, a pure function.

Tested in tests/unit/engine_process/test_watchdog.py (the verdict),
tests/e2e/test_engine_process.py and tests/e2e/test_engine_faults.py.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection

import msgspec

from localserve.config import Config, ConfigError
from localserve.engine.client import (
    AddEmbedding,
    AddRequest,
    EngineClient,
    EngineUnavailable,
    RequestCommand,
    StopEngine,
    TakeSnapshot,
)
from localserve.engine.embedding import check_chat, check_embedding
from localserve.engine.engine import check_prompt
from localserve.engine.events import Admitted, Done, Event, EventSink, Token
from localserve.engine_process.messages import (
    EngineEvents,
    EngineMessage,
    Loaded,
    LoadFailed,
    LoadModel,
    SnapshotAnswer,
)
from localserve.engine_process.step_clock import StepClock
from localserve.engine_process.watchdog import (
    WatchTimes,
    exit_reason,
    has_overrun,
    watchdog_verdict,
)
from localserve.protocol.snapshot import ModelInfo, RunningStep, Snapshot, Worker

log = logging.getLogger("localserve.engine_process.parent")

WATCH_INTERVAL_S = 0.05  # how often the watchdog looks
# a snapshot the engine has not given in this long (it is busy in a step) is the last one, with
# the running step; asked during a step that has run this long, at once. A step's limit: the
# rule in step_clock.py
ANSWER_S = 0.5
PROBE_TIMEOUT_S = 2.0  # a worker that does not answer its hello in this long is "not answering"
RETRY_S = (1.0, 2.0, 5.0, 10.0)  # between restart attempts while workers are missing


@dataclass
class RequestInFlight:
    """A request in the engine process, as far as this side knows it."""

    prompt_tokens: int
    added: float  # time.monotonic() here, as the timings below
    admitted: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    completion_tokens: int = 0

    def timings(self, now: float) -> dict[str, float | None]:
        """The request's timings as seen from this side (for a `done` of our own)."""

        def ms(start: float | None, end: float | None) -> float | None:
            return None if start is None or end is None else (end - start) * 1e3

        n, first, last = self.completion_tokens, self.first_token, self.last_token
        return {
            "queue_ms": ms(self.added, self.admitted),
            "ttft_ms": ms(self.added, first),
            "itl_ms": ms(first, last) / (n - 1) if n > 1 and first and last else None,
            "e2e_ms": ms(self.added, now),
        }


class Vocabulary:
    """The runner's text side, in the server's process: prompts become tokens here."""

    def __init__(self, vocab, info: ModelInfo, where: str) -> None:
        self._vocab = vocab  # runners.llama_text.VocabOnly
        self.info = info
        self.where_text = where  # the engine process's start-up block

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self._vocab.tokenize(text, add_special)

    @property
    def template_source(self) -> str | None:
        return self._vocab.template_source

    def apply_chat_template(
        self, messages: list[dict], tools: list[dict] | None = None, **template_kwargs
    ) -> str:
        return self._vocab.apply_chat_template(messages, tools, **template_kwargs)

    def where(self) -> str:
        return self.where_text

    def close(self) -> None:
        self._vocab.close()


class EngineProcess(EngineClient):
    """The engine in a supervised child process, behind the same interface as `Engine`.

    `start()` loads the model there (raising ConfigError when it cannot: an unreachable worker,
    a file llama.cpp cannot read) and starts the watchdog; `stop()` ends both. Thread-safe.
    """

    def __init__(self, config: Config, name: str) -> None:
        self.config, self.name = config, name
        self.model = config.models[name]
        self.on_events: EventSink = lambda events: None
        self.runner: Vocabulary | None = None  # once started
        self.problem = "starting"  # "" while it serves
        self.workers = [Worker(endpoint, True) for endpoint in self.model.rpc_workers]
        self.restarts = 0
        # the engine's running step (when it started, what it carries), written by the engine
        self._step_clock = StepClock.create()
        self._lock = threading.Lock()  # the state below
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()  # (conn, data) for the writer
        self._sender: threading.Thread | None = None
        self._send_lock = threading.Lock()  # writes to the pipe (never taken with _lock held)
        self._process = None
        self._conn = None
        self._generation = 0  # of the process: a reader of an older one delivers nothing
        self._loaded: Loaded | LoadFailed | None = None
        self._flights: dict[str, RequestInFlight] = {}
        self._asked: dict[int, tuple[float, Future[Snapshot]]] = {}  # number: (when, Future)
        self._numbers = itertools.count(1)
        self._last: Snapshot | None = None
        self._stopping = False
        self._watchdog: threading.Thread | None = None
        self._state = "down"  # loading | serving | down
        self._since = 0.0  # when the state began
        self._next_try = 0.0
        self._attempts = 0  # restarts tried since it went down
        self._why = ""  # why it went down (self.problem adds the workers that are missing)
        self._fault = ""  # set by a reader that failed: the watchdog takes the engine down
        # when the engine was last heard from, last seen in a step, pinged, its workers checked
        self._heard = self._quiet_since = self._pinged = self._checked = 0.0

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> EngineProcess:
        from localserve.runners.llama_text import VocabOnly
        from localserve.runners.models import resolve_model

        path = resolve_model(self.name, self.model)  # the download is said here, not there
        for worker in self._probe_all():
            if not worker.up:
                raise ConfigError(
                    f"models.{self.name}.rpc_workers: RPC worker {worker.endpoint}: "
                    f"{worker.detail}. Start `localserve worker` there (with --allow-network "
                    "and --host for another machine) or remove it from the list"
                )
        self._start_sender()
        self._launch()
        deadline = time.monotonic() + self.config.server.load_timeout_s
        while self._state == "loading" and time.monotonic() < deadline:
            if self._loaded is not None or self._process.poll() is not None:
                break
            time.sleep(0.02)
        loaded = self._loaded
        if not isinstance(loaded, Loaded):
            why = loaded.message if isinstance(loaded, LoadFailed) else self._death()
            self._kill()
            self._outbox.put(None)  # the writer ends
            raise ConfigError(f"models.{self.name}: the engine could not load the model: {why}")
        self.runner = Vocabulary(VocabOnly(path, self.model), loaded.info, loaded.where)
        self._serving()
        self._last = self.snapshot().result(60)  # what a snapshot says while it is down
        self._watchdog = threading.Thread(
            target=self._watch, name="localserve-watchdog", daemon=True
        )
        self._watchdog.start()
        return self

    def _start_sender(self) -> None:
        self._sender = threading.Thread(
            target=self._send_loop, name="localserve-engine-writer", daemon=True
        )
        self._sender.start()

    def stop(self, timeout: float = 10.0) -> None:
        """End the engine process (requests in flight are left as they are) and the watchdog."""
        with self._lock:  # from here on no new process is started (_launch looks under it)
            self._stopping = True
        self._send(self._conn, msgspec.msgpack.encode(StopEngine()))  # after what is queued
        self._outbox.put(None)  # then the writer ends
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout)
        self._kill()
        if self._watchdog is not None:
            self._watchdog.join(2)
        if self._sender is not None:
            self._sender.join(2)
        if self.runner is not None:
            self.runner.close()
        self._step_clock.close()

    def _launch(self) -> None:
        """A new engine process, loading the model (its Loaded or LoadFailed comes to the
        reader)."""
        # a program of its own (`python -m localserve.engine_process.child`), not
        # multiprocessing: fork would copy the server's threads, spawn would import the
        # caller's main module again
        ours, theirs = socket.socketpair()
        root = logging.getLogger()
        files = [h.baseFilename for h in root.handlers if isinstance(h, logging.FileHandler)]
        fds = (theirs.fileno(), self._step_clock.fileno())
        levels = (root.level, logging.getLogger("llama_cpp").getEffectiveLevel())
        numbers = (*fds, *levels, os.getpid())  # the pid: the child's check that we are there
        argv = [sys.executable, "-m", "localserve.engine_process.child", *map(str, numbers)]
        # its output goes where ours does: the log file of a full-screen app, else stderr
        output = open(files[0], "ab") if files else None  # noqa: SIM115 (closed below)
        with self._lock:
            if self._stopping:  # stop() came while the watchdog was probing the workers
                ours.close()
                theirs.close()
                if output is not None:
                    output.close()
                return
            self._step_clock.reset()
            self._generation += 1
            self._loaded = None
            self._fault = ""
            self._state, self._since = "loading", time.monotonic()
            try:
                self._process = subprocess.Popen(
                    argv,
                    pass_fds=fds,
                    stdin=subprocess.DEVNULL,
                    stdout=output or sys.stderr.fileno(),
                    stderr=output or None,
                )
            finally:
                theirs.close()
                if output is not None:
                    output.close()
            self._conn = Connection(ours.detach())
            self._conn.send_bytes(msgspec.msgpack.encode(LoadModel(self.config, self.name)))
        threading.Thread(
            target=self._read,
            args=(self._conn, self._generation),
            name="localserve-engine-reader",
            daemon=True,
        ).start()

    def _serving(self) -> None:
        with self._lock:
            self._state, self._since = "serving", time.monotonic()
            self._heard = self._quiet_since = self._since
            self.problem = ""
            self.workers = [Worker(w.endpoint, True) for w in self.workers]
        log.info("engine process %d serving %s", self._process.pid, self.name)

    # --- the entry points the server uses (add_request, cancel, reject: EngineClient's) ---

    def submit(self, command: RequestCommand) -> None:
        """As Engine.submit; an AddRequest raises EngineUnavailable while the engine is down
        (a cancel or a rejection is dropped then: the engine has nothing to cancel or count)."""
        if isinstance(command, AddRequest | AddEmbedding):
            self._add(command)
            return
        with self._lock:
            conn = None if self.problem else self._conn
        self._send(conn, msgspec.msgpack.encode(command))

    def _add(self, add: AddRequest | AddEmbedding) -> None:
        """Check as the engine does (a refusal never reaches it), keep its flight, send it."""
        info = self.runner.info
        if isinstance(add, AddEmbedding):
            check_embedding(add.request_id, add.inputs, info)
            num_tokens = sum(map(len, add.inputs))
        else:
            check_chat(info)
            check_prompt(len(add.prompt_tokens), info.n_ctx)
            num_tokens = len(add.prompt_tokens)
        data = msgspec.msgpack.encode(add)
        with self._lock:
            if self.problem:
                raise EngineUnavailable(self.problem)
            if add.request_id in self._flights:
                raise ValueError(f"duplicate request id {add.request_id!r}")
            flight = RequestInFlight(num_tokens, time.monotonic())
            self._flights[add.request_id] = flight
            conn = self._conn
        self._send(conn, data)  # if it died a moment ago, the watchdog fails the flight

    def snapshot(self) -> Future[Snapshot]:
        """A Future of the engine's next snapshot; while it is down, of the last one, emptied,
        with what is wrong; while it is busy in a step (ANSWER_S), of the last one with that
        step."""
        future: Future[Snapshot] = Future()
        now = time.monotonic()
        with self._lock:
            if self.problem:
                future.set_result(self._down_snapshot())
                return future
            started = self._step_clock.started
            if started and now - started > ANSWER_S:  # it would answer once the step ends
                future.set_result(self._step_snapshot(now))
                return future
            number = next(self._numbers)
            self._asked[number] = (now, future)
            conn = self._conn
        self._send(conn, msgspec.msgpack.encode(TakeSnapshot(number)))  # gone: _down answers
        return future

    def _send(self, conn: Connection | None, data: bytes) -> None:
        """Queue a message for the engine process: the caller (the event loop, the watchdog)
        never waits on a full pipe, as it would on a stopped (SIGSTOP) engine process."""
        if conn is not None:
            self._outbox.put((conn, data))

    def _send_loop(self) -> None:
        while (item := self._outbox.get()) is not None:
            self._write(*item)

    def _write(self, conn: Connection | None, data: bytes) -> bool:
        """Send to the engine process; False when it is gone. Never with _lock held: the reader
        needs that lock to drain what the engine sends, and a full pipe each way would wait on
        each other."""
        if conn is None:
            return False
        with self._send_lock:
            try:
                conn.send_bytes(data)
            except (OSError, ValueError):  # closed, or the process died
                return False
        return True

    def _step_snapshot(self, now: float) -> Snapshot:
        """The last snapshot with the step running now, and, once that step is past its limit,
        the problem (called with the lock held)."""
        reading = self._step_clock.read()
        if not reading.started:  # between steps yet silent: the heartbeat judges that
            return self._last
        timeout = self.config.server.step_timeout_s
        running_s, limit = max(0.0, now - reading.started), reading.limit_s(timeout)
        step = RunningStep(
            running_s, reading.decode_tokens, reading.prefill_tokens, reading.expected_s, limit
        )
        if not has_overrun(reading, now, timeout):  # a long step is no problem
            return msgspec.structs.replace(self._last, step=step)
        problem = (
            f"a step has run for {running_s:.0f} s, past its limit of "
            f"{reading.describe_limit(timeout)}; the engine process is being stopped"
        )
        return msgspec.structs.replace(self._last, step=step, engine_problem=problem)

    def _answer_late(self, now: float) -> None:
        """Snapshots the engine has not given within ANSWER_S: the last one, with the step."""
        with self._lock:
            late = [n for n, (asked, _) in self._asked.items() if now - asked > ANSWER_S]
            if not late:
                return
            futures = [self._asked.pop(number)[1] for number in late]
            snap = self._step_snapshot(now)
        for future in futures:  # the engine's answer, when it comes, is only kept as the last
            _settle(future, snap)

    def _down_snapshot(self) -> Snapshot:
        """The last snapshot with nothing running or waiting (called with the lock held)."""
        last = self._last
        assert last is not None, "a snapshot before the engine ever loaded"
        return msgspec.structs.replace(
            last,
            running=0,
            waiting=0,
            kv_used=0,
            kv_committed=0,
            kv_cached=0,
            kv_live=0,
            kv_live_used=0,
            cached_prefixes=0,
            seqs=[],
            waiting_seqs=[],
            engine_problem=self.problem,
            workers=list(self.workers),
        )

    # --- the reader: messages from the engine process -----------------------------------------

    def _read(self, conn, generation: int) -> None:
        """Hand on what the engine process sends. If this thread fails, the engine goes down
        (the watchdog restarts it): nothing it sent would reach anyone again."""
        decoder = msgspec.msgpack.Decoder(EngineMessage)
        try:
            while True:
                try:
                    data = conn.recv_bytes()
                except (EOFError, OSError):  # the watchdog sees it end
                    return
                self._heard = time.monotonic()
                self._on_message(decoder.decode(data), generation)
        except Exception as e:
            log.exception("engine reader failed")
            with self._lock:
                if generation == self._generation:
                    self._fault = f"the server stopped hearing the engine ({type(e).__name__}: {e})"
        finally:
            with self._send_lock:  # not while another thread writes to it
                conn.close()

    def _on_message(self, message: EngineMessage, generation: int) -> None:
        if isinstance(message, EngineEvents):
            self._deliver(message.events, generation)
        elif isinstance(message, SnapshotAnswer):
            with self._lock:
                _, future = self._asked.pop(message.number, (0.0, None))
                snap = message.snapshot
                if snap is not None and generation == self._generation:
                    snap = self._last = msgspec.structs.replace(snap, workers=list(self.workers))
            if future is None:
                return
            if message.snapshot is None:
                _settle(future, error=RuntimeError(message.error))
            else:
                _settle(future, snap)
        elif generation == self._generation:
            self._loaded = message

    def _deliver(self, events: list[Event], generation: int) -> None:
        """Hand events on, counting tokens (for a `done` of our own if the process dies)."""
        with self._lock:
            if generation != self._generation:
                return  # its requests have had their `done` already
            keep, ended = [], {}
            now = time.monotonic()
            for event in events:
                flight = self._flights.get(event.request_id)
                if flight is None:
                    continue
                if isinstance(event, Token):
                    flight.completion_tokens += 1
                    flight.first_token = flight.first_token or now
                    flight.last_token = now
                elif isinstance(event, Done):
                    ended[event.request_id] = self._flights.pop(event.request_id)
                elif isinstance(event, Admitted):
                    flight.admitted = flight.admitted or now
                keep.append(event)
        if not keep:
            return
        try:
            self.on_events(keep)
        except Exception:  # their `done`s did not get through: the watchdog's will
            with self._lock:
                if generation == self._generation:
                    self._flights.update(ended)
            raise

    # --- the watchdog -------------------------------------------------------------------------

    def _watch(self) -> None:
        while True:
            time.sleep(WATCH_INTERVAL_S)
            if self._stopping:
                # not before the process has ended: it gets SIGKILL (PR_SET_PDEATHSIG) when the
                # thread that started it ends, and after a restart that is this one
                if self._process is None or self._process.poll() is not None:
                    return
                continue
            try:
                self._look()
            except Exception:  # the watchdog must keep watching, whatever it met
                log.exception("engine watchdog")

    def _look(self) -> None:
        """One look at the engine process: is it alive, within its step, answering?"""
        server = self.config.server
        now = time.monotonic()
        process, state = self._process, self._state
        self._answer_late(now)
        if state == "serving":
            if why := self._what_is_wrong(now):
                self._kill()
                self._down(why)
        elif state == "loading":
            if isinstance(self._loaded, Loaded):
                loaded = self._loaded  # a worker may lend other devices now
                self.runner.info, self.runner.where_text = loaded.info, loaded.where
                self._serving()
                self.restarts += 1
                log.warning("engine process restarted; serving again")
            elif isinstance(self._loaded, LoadFailed) or process.poll() is not None:
                why = self._loaded.message if self._loaded else self._death()
                self._kill()
                self._down(f"reloading failed: {why}")
            elif now - self._since > server.load_timeout_s:
                self._kill()
                self._down(f"loading took longer than {server.load_timeout_s:g} s")
        elif now >= self._next_try:
            self._try_restart()

    def _what_is_wrong(self, now: float) -> str:
        """Why the serving engine must be stopped now; "" while all is well."""
        seen = watchdog_verdict(
            now,
            self._step_clock.read(),
            self.config.server.step_timeout_s,
            WatchTimes(self._heard, self._quiet_since, self._pinged, self._checked),
            self._fault,
            self._process.poll(),
        )
        if seen.kind == "stepping":  # a step runs: its time is watched, not the silence
            self._quiet_since = now
        if seen.ping:
            self._pinged = now
            self._ping()
        if seen.check_workers:
            self._checked = now
            return self._gone_worker()
        return seen.reason

    def _ping(self) -> None:
        """Ask the engine for a snapshot nobody waits for: its answer is the heartbeat."""
        with self._lock:
            number = next(self._numbers)
            conn = self._conn
        self._send(conn, msgspec.msgpack.encode(TakeSnapshot(number)))

    def _gone_worker(self) -> str:
        """A worker whose port refuses connections has gone (llama.cpp would abort at the next
        step): say so now. Only a refusal counts: a live worker serving our engine does not
        answer anyone else's hello, and one that stopped (SIGSTOP) still accepts."""
        from localserve.runners.rpc import refuses

        for endpoint in self.model.rpc_workers:
            if why := refuses(endpoint):
                return f"RPC worker {endpoint}: {why}"
        return ""

    def _death(self) -> str:
        """Why the engine process ended, in words."""
        process = self._process
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(1)
        return exit_reason(process.returncode)

    def _kill(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)

    def _down(self, why: str) -> None:
        """The engine process is gone: say why, fail what was in flight, try again later."""
        if self._stopping:
            return
        with self._lock:  # said at once: snapshots do not wait for the workers' probe below
            self._generation += 1  # the old reader delivers nothing more
            self._why = self.problem = why
            asked, self._asked = self._asked, {}
            self._conn = None  # the reader closes it when the process's end reaches it
            down = self._down_snapshot()
        for _, future in asked.values():
            _settle(future, down)
        workers = self._probe_all()
        with self._lock:
            problem = self._set_workers(workers)
            # a restart whose load failed waits longer each time (a missing file, no memory:
            # no use loading again every second); one that died while serving, 1 s
            self._attempts = self._attempts + 1 if self._state == "loading" else 0
            self._state, self._since = "down", time.monotonic()
            self._next_try = self._since + RETRY_S[min(self._attempts, len(RETRY_S) - 1)]
            flights, self._flights = self._flights, {}
        log.error("engine down: %s; %d requests in flight fail", problem, len(flights))
        message = f"the model stopped: {problem}. Try again shortly"
        events: list[Event] = [_unavailable_done(rid, f, message) for rid, f in flights.items()]
        if events:
            self.on_events(events)

    def _try_restart(self) -> None:
        workers = self._probe_all()
        if not all(w.up for w in workers):
            self._attempts += 1
            wait = RETRY_S[min(self._attempts, len(RETRY_S) - 1)]
            self._next_try = time.monotonic() + wait
            with self._lock:
                self._set_workers(workers)
            return
        with self._lock:
            self._why = f"restarting after: {self._why}"
            self._set_workers(workers)
        log.warning("engine process: loading the model again")
        self._launch()

    def _set_workers(self, workers: list[Worker]) -> str:
        """Workers as just probed; the problem says why it is down and who is missing (called
        with the lock held)."""
        self.workers = workers
        gone = [f"RPC worker {w.endpoint}: {w.detail}" for w in workers if not w.up]
        self.problem = "; ".join([self._why, *gone])
        return self.problem

    def _probe_all(self) -> list[Worker]:
        from localserve.runners.rpc import probe

        workers = []
        for endpoint in self.model.rpc_workers:
            why = probe(endpoint, PROBE_TIMEOUT_S)
            workers.append(Worker(endpoint, why is None, why or ""))
        return workers


def _settle(future: Future, result=None, error: BaseException | None = None) -> None:
    """Resolve a Future another thread may have given up on (cancelled): never raises."""
    try:
        if not future.set_running_or_notify_cancel():
            return  # the asker gave up: nobody is waiting for it
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except Exception:  # already resolved: nothing more to say to anyone
        log.debug("a snapshot's Future was already resolved", exc_info=True)


def _unavailable_done(request_id: str, flight: RequestInFlight, message: str) -> Done:
    """The `done` of a request the engine process took with it when it ended."""
    timings = flight.timings(time.monotonic())
    return Done(
        request_id,
        "error",
        prompt_tokens=flight.prompt_tokens,
        completion_tokens=flight.completion_tokens,
        cached_tokens=0,
        timings=timings,
        error=message,
        error_code="unavailable",
    )
