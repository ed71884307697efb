"""The engine: scheduler + runner on one dedicated thread, requests in, events out.

The engine thread owns the llama.cpp context, the scheduler and the metrics. Other threads talk
to it only through `add_request`, `cancel` and `snapshot` (commands on one queue) and receive
events (`Token`, `Done`, `Admitted`, `Preempted`) through the `on_events` callback, one list per
step, called on the engine thread: an asyncio server passes a function that hands the list to
its loop with `call_soon_threadsafe` (see `AsyncEvents`). `step()` runs one iteration
synchronously, for tests and tools that drive the engine without its thread.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import msgspec

from localserve.config import SchedulerConfig
from localserve.kv import KVPool
from localserve.metrics import Metrics
from localserve.protocol import SeqRow, Snapshot, WaitingRow
from localserve.runner import DecodeError, KVCacheFull, Runner, SamplingError
from localserve.scheduler import Batch, Sampled, Scheduler
from localserve.sequence import FinishReason, SamplingParams, Sequence, Status

log = logging.getLogger("localserve.engine")


class Token(msgspec.Struct, tag=True):
    request_id: str
    text: str  # may be empty: bytes of an unfinished character, or text held back for stops


class Done(msgspec.Struct, tag=True):
    request_id: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    timings: dict[str, float]  # queue_ms, ttft_ms, itl_ms, e2e_ms
    error: str = ""


class Admitted(msgspec.Struct, tag=True):
    request_id: str


class Preempted(msgspec.Struct, tag=True):
    request_id: str


Event = Token | Done | Admitted | Preempted
EventSink = Callable[[list[Event]], None]


class Engine:
    """Continuous batching over one runner; thread-safe entry points, one engine thread."""

    def __init__(
        self,
        runner: Runner,
        config: SchedulerConfig | None = None,
        max_num_batched_tokens: int | None = None,
        on_events: EventSink | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner = runner
        self.config = config or SchedulerConfig()
        info = runner.info
        c = self.config
        reuse = c.prefix_caching and runner.supports_prefix_reuse
        self.kv = KVPool(info.n_ctx, info.n_seq_max, c.kv_watermark, reuse, c.share_prefixes)
        budget = min(max_num_batched_tokens or info.n_batch, info.n_batch)
        max_num_seqs = info.max_num_seqs or info.n_seq_max
        self.scheduler = Scheduler(c, self.kv, max_num_seqs, budget, clock)
        for seq_id in range(info.n_seq_max):  # the pool starts empty: so must the cache
            runner.free_seq(seq_id)
        self.metrics = Metrics(clock)
        self.clock = clock
        self.on_events: EventSink = on_events or (lambda events: None)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._seqs: dict[str, Sequence] = {}  # owned by the engine thread
        self._ids: set[str] = set()  # request ids in flight, for duplicate checks
        self._ids_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False

    # --- thread-safe entry points ----------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_tokens: list[int],
        params: SamplingParams,
        user: str = "",
        shared_prefix_tokens: int = 0,
        share_globally: bool = False,
    ) -> None:
        """Queue a request; raises ValueError for an empty, too long or duplicate one.

        `shared_prefix_tokens`: the prompt starts with a system prompt of this many tokens that
        other requests may share (the user's own, or every user's with `share_globally`).
        """
        n_ctx = self.runner.info.n_ctx
        if len(prompt_tokens) >= n_ctx:
            raise ValueError(
                f"too_long: the prompt has {len(prompt_tokens)} tokens; the context holds {n_ctx}"
            )
        seq = Sequence(request_id, prompt_tokens, params, user, self.clock(), n_ctx)
        seq.shared_prefix_tokens = min(shared_prefix_tokens, len(prompt_tokens))
        seq.share_prefix_globally = share_globally
        with self._ids_lock:
            if request_id in self._ids:
                raise ValueError(f"duplicate request id {request_id!r}")
            self._ids.add(request_id)
        self._commands.put(("add", seq))

    def cancel(self, request_id: str) -> None:
        """Cancel at the next step (also mid-prefill); unknown or finished ids are ignored."""
        self._commands.put(("cancel", request_id))

    def snapshot(self) -> Future[Snapshot]:
        """A Future of the next snapshot, built on the engine thread between steps."""
        future: Future[Snapshot] = Future()
        if self._thread is None:
            future.set_result(self.build_snapshot())
        else:
            self._commands.put(("snapshot", future))
        return future

    def reject(self) -> None:
        """Count a request the server turned away (busy, too long, ...)."""
        self._commands.put(("reject", None))

    # --- the thread ------------------------------------------------------------------------

    def start(self) -> Engine:
        self._thread = threading.Thread(target=self._loop, name="localserve-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the engine thread (in-flight requests are left as they are)."""
        if self._thread is not None:
            self._commands.put(("stop", None))
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while not self._stopping:
            try:
                if not self.scheduler.has_work:
                    self._handle(*self._commands.get())  # idle: sleep until something arrives
                self.step()
            except Exception:  # never die silently: fail what is running, keep serving
                log.exception("engine step failed")
                self._fail_all("internal error in the engine step")

    # --- one iteration ---------------------------------------------------------------------

    def step(self) -> None:
        """Drain commands, schedule, run the batch, emit events."""
        self._drain()
        start = self.clock()
        batch = self.scheduler.schedule()
        events = self._on_scheduled(batch)
        if batch.items:
            events += self._run(batch, start)
        if events:
            self.on_events(events)

    def _drain(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            self._handle(*command)

    def _handle(self, kind: str, arg) -> None:
        if kind == "add":
            self._seqs[arg.request_id] = arg
            try:
                arg.sampler = self.runner.new_sampler(arg.params)
            except Exception as e:  # this request's settings: it fails alone
                log.exception("request %s: no sampler", arg.request_id)
                arg.finish(FinishReason.ERROR, self.clock(), f"sampling setup failed: {e}")
                self.on_events([self._finish(arg)])
                return
            self.scheduler.add(arg)
        elif kind == "cancel" and arg in self._seqs:
            self.scheduler.cancel(self._seqs[arg])
        elif kind == "snapshot":
            if arg.set_running_or_notify_cancel():  # the asker may have given up (cancelled)
                try:
                    arg.set_result(self.build_snapshot())
                except Exception as e:  # the asker must hear of it, not wait forever
                    log.exception("snapshot failed")
                    arg.set_exception(e)
        elif kind == "reject":
            self.metrics.on_rejected()
        elif kind == "stop":
            self._stopping = True

    def _on_scheduled(self, batch: Batch) -> list[Event]:
        self._clear_freed()
        events: list[Event] = []
        for seq in batch.admitted:
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = seq.num_computed  # reused from a cached prefix
                self.metrics.on_admitted(seq)
            events.append(Admitted(seq.request_id))
        for seq in batch.preempted:
            self.metrics.on_preempted(seq)
            events.append(Preempted(seq.request_id))
        events += [self._finish(seq) for seq in batch.finished]
        return events

    def _run(self, batch: Batch, start: float) -> list[Event]:
        try:
            tokens = self.runner.run(batch)
        except KVCacheFull:  # our accounting and llama.cpp disagree: believe llama.cpp
            victims = self.scheduler.on_cache_full(batch)
            log.warning("llama_decode found no KV cells: capacity now %d cells, preempted %s",
                        self.kv.num_cells, victims)  # fmt: skip
            self._clear_freed()
            for seq in victims:
                self.metrics.on_preempted(seq)
            return [Preempted(seq.request_id) for seq in victims]
        except (DecodeError, ValueError) as e:
            log.error("decode failed for %d sequences: %s", len(batch.items), e)
            failed = list({id(i.seq): i.seq for i in batch.items}.values())
            self.scheduler.fail(failed, str(e))
            self._clear_freed()
            return [self._finish(seq) for seq in failed]
        rows = [item.seq for item in batch.items if item.wants_logits]
        results = list(zip(rows, tokens, strict=True))
        failed = [(seq, t) for seq, t in results if isinstance(t, SamplingError)]
        sampled = [
            Sampled(seq, t, self.runner.piece(t), self.runner.is_eog(t))
            for seq, t in results
            if not isinstance(t, SamplingError)
        ]
        step_s = self.clock() - start
        deltas = self.scheduler.postprocess(batch, sampled, step_s)
        events = self._fail_sampling(failed)  # those sequences alone; the rest go on
        self._clear_freed()
        prefill_s = self.scheduler.cost.prefill_token_s * batch.num_prefill_tokens
        self.metrics.on_step(
            batch.num_decode_tokens, batch.num_prefill_tokens,
            self.clock() - start, self.runner.last_decode_s, prefill_s, len(sampled),
        )  # fmt: skip
        for s, text in zip(sampled, deltas, strict=True):
            self.metrics.on_token(s.seq)
            events.append(Token(s.seq.request_id, text))
            if s.seq.is_finished:
                events.append(self._finish(s.seq))
        return events

    def _fail_sampling(self, failed: list[tuple[Sequence, SamplingError]]) -> list[Event]:
        events: list[Event] = []
        for seq, error in failed:
            log.error("request %s failed: %s", seq.request_id, error)
            self.scheduler.fail([seq], f"sampling failed for this request: {error}")
            events.append(self._finish(seq))
        return events

    def _finish(self, seq: Sequence) -> Done:
        self.runner.free_sampler(seq.sampler)
        seq.sampler = None
        self._seqs.pop(seq.request_id, None)
        with self._ids_lock:
            self._ids.discard(seq.request_id)
        self.metrics.on_finished(seq)
        timings = {k: (None if math.isnan(v) else v) for k, v in seq.timings().items()}
        return Done(
            seq.request_id,
            seq.finish_reason.value,
            prompt_tokens=seq.num_prompt_tokens,
            completion_tokens=seq.num_output_tokens,
            cached_tokens=seq.num_cached_tokens,
            timings=timings,
            error=seq.error,
        )

    def _clear_freed(self) -> None:
        """Apply the pool's cell operations in llama.cpp, in the order they were decided."""
        refused = []
        for op in self.kv.take_ops():  # all of them, even after a refusal: ids get reused
            if op.kind == "free":
                self.runner.free_seq(op.seq_id)
            elif op.kind == "copy":
                self.runner.copy_seq(op.seq_id, op.dst, op.n)
            elif not self.runner.trim_seq(op.seq_id, op.n):  # a memory without partial removal
                refused.append(op)
        if refused:
            raise RuntimeError(f"llama.cpp could not trim sequences to a prefix: {refused}")

    def _fail_all(self, message: str) -> None:
        seqs = list(self._seqs.values())
        running = [s for s in seqs if s.status is Status.RUNNING]
        self.scheduler.fail(running, message)
        for seq in seqs:
            if seq.status is not Status.FINISHED:
                self.scheduler.cancel(seq)
        self._clear_freed()
        events: list[Event] = [self._finish(s) for s in running]
        if events:
            self.on_events(events)

    # --- reading ---------------------------------------------------------------------------

    def build_snapshot(self) -> Snapshot:
        """Everything the monitor and /metrics show; call on the engine thread."""
        m, sched, kv, now = self.metrics, self.scheduler, self.kv, self.clock()
        latency = m.latency()
        prompt_tps, gen_tps = m.throughput()
        return Snapshot(
            uptime_s=now - m.start_time,
            model=self.runner.info,
            policy=self.config.policy,
            max_num_seqs=sched.max_num_seqs,
            max_num_batched_tokens=sched.max_num_batched_tokens,
            itl_target_s=self.config.itl_target_ms / 1e3,
            running=len(sched.running),
            waiting=sched.num_waiting,
            kv_used=kv.num_used,
            kv_committed=kv.num_committed,
            kv_total=kv.num_cells,
            kv_cached=kv.num_cached,
            cached_prefixes=len(kv.prefixes),
            free_seq_ids=kv.num_free_seq_ids,
            window_s=m.window_s,
            **latency,
            prompt_tokens_per_s=prompt_tps,
            generation_tokens_per_s=gen_tps,
            steps=m.step_stats(sched.last_prefill_budget),
            counters=msgspec.structs.replace(m.counters, prefix_evictions=kv.num_evictions),
            seqs=[_seq_row(s, now) for s in sched.running],
            waiting_seqs=[_waiting_row(i, s, now) for i, s in enumerate(sched.waiting_seqs(), 1)],
            events=list(m.events),
            histograms=m.export_histograms(),
        )


def _seq_row(seq: Sequence, now: float) -> SeqRow:
    ttft = seq.timings_s()[1]
    first, last = seq.first_token_time, seq.last_token_time
    n = seq.num_output_tokens
    return SeqRow(
        request_id=seq.request_id,
        user=seq.user,
        phase="prefill" if seq.is_prefilling or seq.num_computed == 0 else "decode",
        prompt_tokens=seq.num_prompt_tokens,
        computed_tokens=seq.num_computed,
        output_tokens=n,
        cells=seq.num_cells,
        cached_tokens=seq.num_cached_tokens,
        tokens_per_s=(n - 1) / (last - first) if n > 1 and last > first else None,
        ttft_s=None if math.isnan(ttft) else ttft,
        last_itl_s=seq.last_itl_s,
        since_last_token_s=now - last if last is not None else None,
        num_preemptions=seq.num_preemptions,
    )


def _waiting_row(position: int, seq: Sequence, now: float) -> WaitingRow:
    since = seq.queued_time if seq.queued_time is not None else now
    return WaitingRow(
        position=position,
        request_id=seq.request_id,
        user=seq.user,
        prompt_tokens=seq.num_prompt_tokens,
        waited_s=seq.queue_s + now - since,
        is_preempted=seq.num_preemptions > 0,
    )


class AsyncEvents:
    """Bridge engine events into an asyncio loop: pass as `on_events`, then `await get()`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[list[Event]] = asyncio.Queue()

    def __call__(self, events: list[Event]) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, events)

    async def get(self) -> list[Event]:
        return await self._queue.get()


class EventRouter:
    """Events to one blocking queue per request, for synchronous callers (CLI, benchmarks)."""

    def __init__(self) -> None:
        self._queues: dict[str, queue.SimpleQueue[Event]] = {}
        self._lock = threading.Lock()

    def open(self, request_id: str) -> queue.SimpleQueue[Event]:
        with self._lock:
            return self._queues.setdefault(request_id, queue.SimpleQueue())

    def __call__(self, events: list[Event]) -> None:
        for event in events:
            with self._lock:
                q = self._queues.get(event.request_id)
                if isinstance(event, Done):
                    self._queues.pop(event.request_id, None)
            if q is not None:
                q.put(event)
