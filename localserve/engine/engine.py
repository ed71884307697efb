"""The engine: scheduler + runner on one dedicated thread, requests in, events out.

The engine thread owns the llama.cpp context, the scheduler and the metrics. Other threads talk
to it only through the entry points of `EngineClient` (localserve.engine.client: `add_request`,
`cancel`, `reject`, `snapshot`, all commands on one queue) and receive events
(localserve.engine.events) through the `on_events` callback, one list per step, called on the
engine thread. `step()` runs one iteration synchronously, for tests and tools that drive the
engine without its thread:

    schedule -> run -> postprocess -> emit

The scheduler builds the batch (with the KV cell operations its pool decided), the runner
applies those and decodes, the scheduler accounts the sampled tokens and finished sequences,
and emit turns the outcome into events and metrics. A step's embedding inputs
(localserve.engine.embedding) are decoded by the runner's `embed` right after its chat batch,
within the step's time; a failed embedding decode fails those embedding requests alone.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import NamedTuple

from localserve.config import SchedulerConfig
from localserve.engine.batch import Batch, Sampled
from localserve.engine.client import (
    AddEmbedding,
    AddRequest,
    CancelRequest,
    CountRejection,
    EngineClient,
    EngineCommand,
    RequestCommand,
    StopEngine,
    TakeSnapshot,
)
from localserve.engine.embedding import (
    EmbeddingQueue,
    EmbeddingRequest,
    check_chat,
    check_embedding,
)
from localserve.engine.events import (
    Admitted,
    Done,
    Embedded,
    Event,
    EventSink,
    Preempted,
    Token,
)
from localserve.engine.kv import KVPool
from localserve.engine.metrics import Metrics
from localserve.engine.prefix_tiers import (
    CHEAP_TOKENS,
    DEFAULT_BYTES_PER_TOKEN,
    DiskReads,
    HostTier,
    PrefixDisk,
    SavedPrefix,
)
from localserve.engine.runner import DecodeError, KVCacheFull, RestoreFailed, Runner
from localserve.engine.scheduler import Scheduler
from localserve.engine.sequence import FinishReason, Sequence, Status
from localserve.engine.snapshot import build_snapshot
from localserve.engine.waits import WaitForecast
from localserve.protocol.snapshot import Snapshot

log = logging.getLogger("localserve.engine.engine")


class StepTimings(NamedTuple):
    """Where the last step spent its time, in seconds of the engine's clock (for benchmarks)."""

    schedule_s: float = 0.0
    run_s: float = 0.0  # the runner: cell operations, fill, decode, sampling
    postprocess_s: float = 0.0
    emit_s: float = 0.0


def _pool(runner: Runner, c: SchedulerConfig, reuse: bool, host_cache_bytes: int) -> KVPool:
    """The KV pool over the runner's cells, with the host tier below them: its first estimate
    of a state's size per token is the runner's (the first save measures it)."""
    per_token = getattr(runner, "kv_bytes_per_token", DEFAULT_BYTES_PER_TOKEN)
    host = HostTier(host_cache_bytes if reuse else 0, bytes_per_token=per_token)
    window = getattr(runner, "swa_window", 0)  # a saved state keeps only that window's cells
    cells = (runner.info.n_ctx, runner.info.n_seq_max, c.kv_watermark)
    return KVPool(*cells, reuse, c.share_prefixes, host, window, c.shed_saved_prefixes)


def check_prompt(num_tokens: int, n_ctx: int) -> None:
    """Raise ValueError (too_long) for a prompt the context cannot hold with one token more."""
    if num_tokens >= n_ctx:
        raise ValueError(f"too_long: the prompt has {num_tokens} tokens; the context holds {n_ctx}")


class QueuedCommand(NamedTuple):
    """A command on its way to the engine thread, with what the caller's side made of it."""

    command: EngineCommand | None  # None: only wakes the engine (a disk read is done)
    # an AddRequest's sequence or an AddEmbedding's request, built (and checked) by the caller
    seq: Sequence | EmbeddingRequest | None = None
    reply: Future[Snapshot] | None = None  # where a TakeSnapshot's snapshot goes
    # an AddRequest's saved prefix being read from the disk tier (None: nothing to read)
    loading: Future[SavedPrefix | None] | None = None


class Engine(EngineClient):
    """Continuous batching over one runner; thread-safe entry points, one engine thread."""

    problem = ""  # why it does not serve ("" = it does): always "" in the server's own process

    def __init__(
        self,
        runner: Runner,
        config: SchedulerConfig | None = None,
        max_num_batched_tokens: int | None = None,
        on_events: EventSink | None = None,
        clock: Callable[[], float] = time.monotonic,
        host_cache_bytes: int = 0,
        disk: PrefixDisk | None = None,
    ) -> None:
        """`host_cache_bytes`: the host tier's budget (0: none); `disk`: the disk tier below
        it (localserve.runners.prefix_disk), closed with the engine."""
        self.runner = runner
        self.config = config or SchedulerConfig()
        info = runner.info
        c = self.config
        reuse = c.prefix_caching and runner.supports_prefix_reuse
        self.kv = _pool(runner, c, reuse, host_cache_bytes)
        self.disk = disk if reuse else None
        self._reads = DiskReads(c.share_prefixes == "all")  # requests waiting for a disk read
        budget = min(max_num_batched_tokens or info.n_batch, info.n_batch)
        max_num_seqs = info.max_num_seqs or info.n_seq_max
        # drafts need the cache cut back to a prefix (rejected draft cells are trimmed)
        draft_rows = info.max_draft_rows if runner.supports_prefix_reuse else 0
        embeddings = EmbeddingQueue(info.max_embed_tokens, info.max_embed_step_inputs)
        self.scheduler = Scheduler(
            c, self.kv, max_num_seqs, budget, clock, draft_rows, embeddings=embeddings
        )
        for seq_id in range(info.n_seq_max):  # the pool starts empty: so must the cache
            runner.free_seq(seq_id)
        self.metrics = Metrics(clock, max_model_len=info.n_ctx, prefix_caching=reuse)
        self.forecast = WaitForecast()  # the waiting requests' places and predicted waits
        self.clock = clock
        self.on_events: EventSink = on_events or (lambda events: None)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._seqs: dict[str, Sequence] = {}  # owned by the engine thread
        self._embeds: dict[str, EmbeddingRequest] = {}  # owned by the engine thread
        self._ids: set[str] = set()  # request ids in flight, for duplicate checks
        self._ids_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.timings = StepTimings()  # of the last step
        # told True before each step of the engine thread and False after (the engine process's
        # watchdog times steps with it); None: nobody watches
        self.watch: Callable[[bool], None] | None = None
        # told, once each step with tokens is scheduled, its decode and prompt tokens, the cost
        # model's prediction of its time and whether that rests on a measured step of its kind
        # (the watchdog's step limit comes from them); None: nobody asks
        self.expect: Callable[[int, int, float, bool], None] | None = None

    # --- thread-safe entry points (add_request, cancel and reject come from EngineClient) ---

    def submit(self, command: RequestCommand) -> None:
        """Queue a command for the engine thread; an AddRequest raises ValueError for an empty,
        too long or duplicate request, an AddEmbedding for inputs check_embedding refuses."""
        if not isinstance(command, RequestCommand):  # snapshot() and stop() queue their own
            raise TypeError(f"not a request command: {type(command).__name__}")
        seq, loading = None, None
        if isinstance(command, AddRequest):
            seq = self._new_sequence(command)
            # the disk tier's read of its longest saved prefix, when the host tier lacks it
            # (on the disk tier's reader thread; the engine is woken when it is done)
            wake = lambda _: self._commands.put(QueuedCommand(None))  # noqa: E731
            loading = self._reads.start(self.disk, seq, self.kv, wake)
        elif isinstance(command, AddEmbedding):
            seq = self._new_embedding(command)
        self._commands.put(QueuedCommand(command, seq=seq, loading=loading))

    def _new_embedding(self, add: AddEmbedding) -> EmbeddingRequest:
        check_embedding(add.request_id, add.inputs, self.runner.info)
        client_id = add.request_id if add.client_id is None else add.client_id
        request = EmbeddingRequest(add.request_id, client_id, add.user, add.inputs, self.clock())
        self._claim_id(add.request_id)
        return request

    def _claim_id(self, request_id: str) -> None:
        with self._ids_lock:
            if request_id in self._ids:
                raise ValueError(f"duplicate request id {request_id!r}")
            self._ids.add(request_id)

    def _new_sequence(self, add: AddRequest) -> Sequence:
        n_ctx = self.runner.info.n_ctx
        check_chat(self.runner.info)
        check_prompt(len(add.prompt_tokens), n_ctx)
        seq = Sequence(add.request_id, add.prompt_tokens, add.params, add.user, self.clock(), n_ctx)
        seq.system_tokens = min(add.system_tokens, len(add.prompt_tokens))
        seq.system_is_global = add.system_is_global
        seq.client_id = add.request_id if add.client_id is None else add.client_id
        self._claim_id(add.request_id)
        return seq

    def snapshot(self) -> Future[Snapshot]:
        """A Future of the next snapshot, built on the engine thread between steps."""
        future: Future[Snapshot] = Future()
        if self._thread is None:
            future.set_result(build_snapshot(self))
        else:
            self._commands.put(QueuedCommand(TakeSnapshot(), reply=future))
        return future

    # --- the thread ------------------------------------------------------------------------

    def start(self) -> Engine:
        self._thread = threading.Thread(target=self._loop, name="localserve-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the engine thread (in-flight requests are left as they are)."""
        if self._thread is not None:
            self._commands.put(QueuedCommand(StopEngine()))
            self._thread.join(timeout)
            self._thread = None
        if self.disk is not None:
            self.disk.close()  # what is queued is written (bounded), then the writer ends

    def _loop(self) -> None:
        watch = self.watch or (lambda busy: None)
        while not self._stopping:
            try:
                if not self.scheduler.has_work:  # idle: sleep until something arrives ...
                    try:  # ... or a disk read is given up
                        command = self._commands.get(timeout=self._reads.wait_s)
                    except queue.Empty:
                        command = QueuedCommand(None)
                    watch(True)
                    self._handle(command)
                watch(True)  # (the step is timed from here; handling a command counts too)
                self.step()
            except Exception:  # never die silently: fail what is running, keep serving
                log.exception("engine step failed")
                self._fail_all("internal error in the engine step")
            finally:
                watch(False)

    # --- one iteration ---------------------------------------------------------------------

    def step(self) -> None:
        """One iteration: drain commands, then schedule -> run -> postprocess -> emit."""
        self._drain()
        start = self.clock()
        batch = self.scheduler.schedule()
        scheduled = self.clock()
        if self.expect is not None and (batch.num_tokens or batch.num_embed_tokens):
            self._tell_expected(batch)
        sampled = self._run(batch)
        batch.restore_s = self.runner.timings.restore_s
        self.metrics.on_restored(batch.restored)  # before postprocess moves num_computed on
        for saved in self.kv.host.settle():  # this step's copies out: written behind
            if self.disk is not None and len(saved.tokens) >= CHEAP_TOKENS:
                self.disk.put(saved)
        vectors = self._embed(batch)
        ran = self.clock()
        self.scheduler.postprocess(batch, sampled, ran - start)
        done = self.clock()
        events = self._emit(batch, sampled, done - start)
        events += self._emit_embeddings(batch, vectors, done)
        if self.scheduler.num_waiting and self.forecast.is_due(done):
            predicted = self.scheduler.predict_waits(self.forecast.lengths)
            events += self.forecast.announce(predicted, self.scheduler.waiting_seqs(), done)
        if events:
            self.on_events(events)
        emitted = self.clock()
        self.timings = StepTimings(scheduled - start, ran - scheduled, done - ran, emitted - done)

    def _tell_expected(self, batch: Batch) -> None:
        """The step's tokens and predicted time for the watchdog: its embedding tokens count as
        prompt tokens there, and their price is in the prediction."""
        cost, num_decode, num_prefill, num_embed = (
            self.scheduler.cost,
            batch.num_decode_tokens + batch.num_draft_tokens,
            batch.num_prefill_tokens,
            batch.num_embed_tokens,
        )
        predicted = self.scheduler.predict_step(batch)  # draft rows priced apart
        measured = cost.is_measured(num_decode, num_prefill, num_embed)
        self.expect(num_decode, num_prefill + num_embed, predicted, measured)

    def _drain(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            self._handle(command)
        for seq, saved in self._reads.ready(self.clock()) if self._reads.waiting else ():
            if saved is not None:  # read from disk: the host tier has it now
                self.kv.host.adopt(saved)
            self.scheduler.add(seq)

    def _handle(self, queued: QueuedCommand) -> None:
        command = queued.command
        if isinstance(command, AddRequest):
            self._admit(queued.seq, queued.loading)
        elif isinstance(command, AddEmbedding):
            self._embeds[command.request_id] = queued.seq
            self.scheduler.embeddings.add(queued.seq)
        elif isinstance(command, CancelRequest) and command.request_id in self._seqs:
            self.scheduler.cancel(self._seqs[command.request_id])
        elif isinstance(command, CancelRequest) and command.request_id in self._embeds:
            self.scheduler.embeddings.cancel(self._embeds[command.request_id])
        elif isinstance(command, TakeSnapshot):
            self._answer(queued.reply)
        elif isinstance(command, CountRejection):
            self.metrics.on_rejected()
        elif isinstance(command, StopEngine):
            self._stopping = True

    def _admit(self, seq: Sequence, loading: Future | None = None) -> None:
        self._seqs[seq.request_id] = seq
        try:
            seq.sampler = self.runner.new_sampler(seq.params)
        except Exception as e:  # this request's settings: it fails alone
            log.exception("request %s: no sampler", seq.request_id)
            seq.finish(FinishReason.ERROR, self.clock(), f"sampling setup failed: {e}")
            self.on_events([self._finish(seq)])
            return
        if loading is not None:  # it joins the queue once its saved prefix is read
            self._reads.add(seq, loading, self.clock())
            return
        self.scheduler.add(seq)

    def _answer(self, reply: Future[Snapshot]) -> None:
        if reply.set_running_or_notify_cancel():  # the asker may have given up (cancelled)
            try:
                reply.set_result(build_snapshot(self))
            except Exception as e:  # the asker must hear of it, not wait forever
                log.exception("snapshot failed")
                reply.set_exception(e)

    def _run(self, batch: Batch) -> list[Sampled]:
        """The runner's step. When it computes nothing, the scheduler hears why and empties
        the batch: no cells (preempt to fit) or a failed decode (those sequences end)."""
        try:
            return self.runner.run(batch)
        except RestoreFailed as e:  # those sequences are prefilled instead
            log.warning("%s: prefilling them instead", e)
            self.scheduler.on_restore_failed(batch, e.seq_ids)
        except KVCacheFull:  # our accounting and llama.cpp disagree: believe llama.cpp
            victims = self.scheduler.on_cache_full(batch)
            log.warning(
                "llama_decode found no KV cells: capacity now %d cells, preempted %s",
                self.kv.num_cells,
                victims,
            )
        except (DecodeError, ValueError) as e:
            log.error("decode failed for %d sequences: %s", len(batch.items), e)
            self.scheduler.on_failed(batch, str(e))
        return []

    def _embed(self, batch: Batch):
        """The step's embedding decode; when it fails, those embedding requests end with the
        error (into `batch.embeds_finished`) and the chats go on."""
        if not batch.embeds:
            return None
        try:
            vectors = self.runner.embed([item.request.inputs[item.index] for item in batch.embeds])
            batch.embed_s = self.runner.timings.embed_s
            return vectors
        except (DecodeError, ValueError) as e:
            log.error("embedding decode failed for %d inputs: %s", len(batch.embeds), e)
            failed = list({id(i.request): i.request for i in batch.embeds}.values())
            self.scheduler.embeddings.fail(failed, f"embedding failed: {e}", self.clock())
            batch.embeds_finished += failed
            batch.embeds = []
            return None

    def _emit_embeddings(self, batch: Batch, vectors, now: float) -> list[Event]:
        """Embedded then Done for each embedding request whose vectors are all in; Done for
        those cancelled or failed."""
        events: list[Event] = [self._finish_embedding(r) for r in batch.embeds_finished]
        if batch.embeds:
            self.metrics.on_embedded(len(batch.embeds), batch.num_embed_tokens)
            for request in self.scheduler.embeddings.done(batch.embeds, vectors, now):
                vectors_out = [v.tolist() for v in request.vectors]
                events.append(Embedded(request.request_id, vectors_out))
                events.append(self._finish_embedding(request))
        return events

    def _finish_embedding(self, request: EmbeddingRequest) -> Done:
        self._embeds.pop(request.request_id, None)
        with self._ids_lock:
            self._ids.discard(request.request_id)
        self.metrics.on_embedding_finished(request)
        return Done(
            request.request_id,
            request.finish_reason,
            prompt_tokens=request.num_tokens,
            completion_tokens=0,
            cached_tokens=0,
            timings=request.timings(),
            error=request.error,
        )

    def _emit(self, batch: Batch, sampled: list[Sampled], step_s: float) -> list[Event]:
        """The step's outcome as events, in order, with the metrics that count them."""
        for seq in batch.first_admitted:
            self.metrics.on_admitted(seq)
        events: list[Event] = [Admitted(seq.request_id) for seq in batch.admitted]
        for seq in batch.preempted:
            self.metrics.on_preempted(seq)
            events.append(Preempted(seq.request_id))
        events += [self._finish(seq) for seq in batch.finished]
        if batch.items or batch.embeds:
            cost, timings = self.scheduler.cost, self.runner.timings
            rows = batch.num_decode_tokens + batch.num_draft_tokens
            prefill_s = cost.prefill_s(rows, batch.num_prefill_tokens)
            in_llama = (timings.decode_s if batch.items else 0.0) + (
                timings.embed_s if batch.embeds else 0.0
            )
            self.metrics.on_step(
                batch.num_decode_tokens,
                batch.num_prefill_tokens,
                step_s,
                in_llama,
                prefill_s,
                batch.num_generated,
                batch.num_draft_tokens,
                batch.num_accepted_tokens,
                batch.is_stretched,
                num_embed=batch.num_embed_tokens,
                num_embed_inputs=len(batch.embeds),
            )
            if batch.num_drafts:
                self.metrics.on_drafts(
                    batch.num_drafts,
                    batch.num_draft_tokens,
                    batch.num_accepted_tokens,
                    batch.accepted_by_position,
                )
        for s in sampled:
            if s.error:
                log.error("request %s failed: %s", s.seq.request_id, s.error)
        for seq, kept in batch.kept:
            if kept:
                self.metrics.on_token(seq, kept)
                events.append(Token(seq.request_id, seq.take_text()))
            if seq.is_finished:
                events.append(self._finish(seq))
        return events

    def _finish(self, seq: Sequence) -> Done:
        self.runner.free_sampler(seq.sampler)
        seq.sampler = None
        self._seqs.pop(seq.request_id, None)
        with self._ids_lock:
            self._ids.discard(seq.request_id)
        self.metrics.on_finished(seq)
        self.forecast.finished(seq)
        timings = {k: (None if math.isnan(v) else v) for k, v in seq.timings().items()}
        return Done(
            seq.request_id,
            seq.finish_reason.value,
            prompt_tokens=seq.num_prompt_tokens,
            completion_tokens=seq.num_output_tokens,
            cached_tokens=seq.cached_tokens,
            timings=timings,
            error=seq.error,
            stop=seq.stream.stop_hit,
        )

    def _fail_all(self, message: str) -> None:
        """A step raised: running sequences fail, waiting ones are cancelled at the next step,
        and those that finished in the broken step (Done not yet sent) get their Done now."""
        seqs = list(self._seqs.values())
        running = [s for s in seqs if s.status is Status.RUNNING]
        self.scheduler.fail(running, message)
        for seq in seqs:
            if seq.status is not Status.FINISHED:
                self.scheduler.cancel(seq)
        events: list[Event] = [self._finish(s) for s in seqs if s.status is Status.FINISHED]
        embeddings, now = self.scheduler.embeddings, self.clock()
        for request in list(self._embeds.values()):  # whatever the broken step held is lost
            if request.is_running or request.is_finished:  # (finished: its Embedded never went)
                embeddings.fail([request], message, now)
                request.finish_reason, request.error = "error", message
                events.append(self._finish_embedding(request))
            else:
                embeddings.cancel(request)
        if events:
            self.on_events(events)
