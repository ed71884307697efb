"""Metrics with vLLM's definitions, recorded by the engine thread.

- TTFT = arrival -> first token; queue time = waiting before admission (re-queues after a
  preemption included); ITL = gap between successive tokens of one request (pooled);
  TPOT = (last - first token) / (n - 1); e2e = arrival -> finished.
- Per finished request, as vLLM: its prompt and generated lengths and its max_tokens; prefill
  time = first admission -> first token, decode time = first -> last token, inference time =
  first admission -> last token (preemptions included; only for requests that got a token).
- Prefix cache queries and hits count tokens: every first admission's prompt tokens while
  prefix caching is on, and the tokens it reused.
- Restores (localserve.engine.prefix_tiers) are counted per tier, by where the KV state came
  from: a saved prefix read from the disk is a disk hit, any other a host hit; each counts the
  restore's tokens and bytes, at the step that made it (a re-admission after a preemption too).
- Sliding windows give p50/p90/p99 for the monitor (None when empty); cumulative histograms
  with vLLM's buckets feed `/metrics`; counters and per-step records (decode vs prefill tokens,
  step time, time outside llama_decode) complete the picture. The engine packs it all into one
  `Snapshot` Struct.
- Embedding requests are their own kind: counted apart (requests, inputs, tokens, errors and
  cancellations), their steps' embedding tokens and inputs give the embedding throughput; they
  enter no chat latency window.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Iterable
from typing import NamedTuple

from localserve.engine.prefix_tiers import TierCounters
from localserve.engine.sequence import FinishReason, Sequence
from localserve.engine.slowdown import Slowdown
from localserve.engine.stats import percentile
from localserve.protocol.snapshot import Counters, EventRow, Histogram, Percentiles, StepStats

# vLLM's bucket boundaries (seconds)
# fmt: off
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
# fmt: on


def build_1_2_5_buckets(max_value: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to `max_value` (vLLM's buckets for token counts)."""
    buckets: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return buckets
            buckets.append(float(mantissa * scale))
        scale *= 10


class StepRecord(NamedTuple):
    t: float
    num_decode: int
    num_prefill: int
    num_sampled: int  # tokens generated (decodes plus first tokens of finished prefills)
    step_s: float
    decode_s: float  # inside llama_decode
    prefill_s: float  # the cost model's share for the prefill tokens
    num_draft: int = 0  # draft rows verified (speculative decoding)
    num_accepted: int = 0  # of those, accepted
    is_stretched: bool = False  # the TTFT target gave it more prompt tokens than the ITL one
    num_embed: int = 0  # embedding tokens (the runner's embedding decode in the same step)
    num_embed_inputs: int = 0


class Window:
    """(time, value) pairs from the last `span_s` seconds."""

    def __init__(self, span_s: float, maxlen: int = 20_000) -> None:
        self.span_s = span_s
        self._items: deque[tuple[float, float]] = deque(maxlen=maxlen)

    def add(self, t: float, value: float) -> None:
        self._items.append((t, value))

    def values(self, now: float) -> list[float]:
        cutoff = now - self.span_s
        while self._items and self._items[0][0] < cutoff:
            self._items.popleft()
        return [v for _, v in self._items]


def percentiles(values: Iterable[float]) -> Percentiles:
    """p50/p90/p99 (numpy's linear interpolation, as the load generator's) and mean."""
    xs = sorted(values)
    if not xs:
        return Percentiles(None, None, None, None, 0)
    p50, p90, p99 = (percentile(xs, q) for q in (50, 90, 99))
    return Percentiles(p50, p90, p99, sum(xs) / len(xs), len(xs))


class CumulativeHistogram:
    def __init__(self, buckets: list[float]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.sum += value
        self.count += 1

    def export(self) -> Histogram:
        running, cumulative = 0, []
        for c in self.counts:
            running += c
            cumulative.append(running)
        return Histogram(list(self.buckets), cumulative, self.sum, self.count)


class Metrics:
    """Every number the engine exposes; one writer (the engine thread)."""

    def __init__(
        self,
        clock: Callable[[], float],
        window_s: float = 60.0,
        max_model_len: int = 4096,
        prefix_caching: bool = True,
    ) -> None:
        """`max_model_len` (the context) bounds the token-count buckets; `prefix_caching` says
        whether admissions look prompts up in the prefix cache (counted as queries)."""
        self.clock = clock
        self.start_time = clock()
        self.window_s = window_s
        self.prefix_caching = prefix_caching
        lengths = build_1_2_5_buckets(max_model_len)
        self.counters = Counters()
        self.ttft, self.itl = Window(window_s), Window(window_s)
        self.queue, self.e2e, self.tpot = Window(window_s), Window(window_s), Window(window_s)
        # the first predicted wait's error (localserve.engine.waits) of each request that waited:
        # seconds off, and the share of its actual wait (over a longer span: waits are rarer)
        self.queue_error, self.queue_error_share = Window(10 * window_s), Window(10 * window_s)
        self.histograms = {
            "time_to_first_token_seconds": CumulativeHistogram(TTFT_BUCKETS),
            "inter_token_latency_seconds": CumulativeHistogram(ITL_BUCKETS),
            "request_queue_time_seconds": CumulativeHistogram(LATENCY_BUCKETS),
            "request_queue_time_prediction_error_seconds": CumulativeHistogram(TTFT_BUCKETS),
            "e2e_request_latency_seconds": CumulativeHistogram(LATENCY_BUCKETS),
            "request_time_per_output_token_seconds": CumulativeHistogram(ITL_BUCKETS),
            "request_prefill_time_seconds": CumulativeHistogram(LATENCY_BUCKETS),
            "request_decode_time_seconds": CumulativeHistogram(LATENCY_BUCKETS),
            "request_inference_time_seconds": CumulativeHistogram(LATENCY_BUCKETS),
            "request_prompt_tokens": CumulativeHistogram(lengths),
            "request_generation_tokens": CumulativeHistogram(lengths),
            "request_params_max_tokens": CumulativeHistogram(lengths),
            "request_max_num_generation_tokens": CumulativeHistogram(lengths),
            "iteration_tokens_total": CumulativeHistogram(ITERATION_TOKEN_BUCKETS),
        }
        self.steps: deque[StepRecord] = deque(maxlen=256)
        self.slowdown = Slowdown()  # the steps against this machine's own best
        self.events: deque[EventRow] = deque(maxlen=100)
        # restores by the tier their KV state came from (hits, restored tokens and bytes), and
        # each running sequence's latest one: (tokens restored, tier)
        self.tiers = {"host": TierCounters(), "disk": TierCounters()}
        self.restored: dict[str, tuple[int, str]] = {}

    # --- recording -------------------------------------------------------------------------

    def event(self, kind: str, seq: Sequence, detail: str = "", at: float | None = None) -> None:
        """Log what happened to a sequence, at `at` (the engine's clock; default now)."""
        t = (self.clock() if at is None else at) - self.start_time
        self.events.append(EventRow(t, kind, seq.request_id, seq.user, detail))

    def on_admitted(self, seq: Sequence) -> None:
        """First admission: the queue time ends, the prompt counts."""
        self.counters.requests += 1
        self.counters.prompt_tokens += seq.num_prompt_tokens
        if self.prefix_caching:
            self.counters.prefix_cache_queries += seq.num_prompt_tokens
        self._observe(self.queue, "request_queue_time_seconds", seq.queue_s)
        if seq.wait_prediction is not None and seq.first_scheduled_time is not None:
            made_at, predicted_s = seq.wait_prediction
            actual_s = seq.first_scheduled_time - made_at
            error_s = abs(predicted_s - actual_s)
            self._observe(self.queue_error, "request_queue_time_prediction_error_seconds", error_s)
            self.queue_error_share.add(self.clock(), error_s / max(actual_s, 1e-3))
        detail = f"{seq.num_prompt_tokens} prompt tokens"
        if seq.cached_tokens:
            self.counters.cached_tokens += seq.cached_tokens
            self.counters.prefix_hits += 1
            restored = self.restored.get(seq.request_id)
            if restored is not None:
                detail += f", {restored[0]} restored from {restored[1]}"
            else:
                detail += f", {seq.cached_tokens} reused"
        self.event("admitted", seq, detail, at=seq.first_scheduled_time)

    def on_restored(self, seqs: Iterable[Sequence]) -> None:
        """The step's restores (`Batch.restored`), once the runner has made them and before
        postprocess: a sequence's computed tokens are still the ones restored. One that failed
        or lost its cells in the step has no `restored_from` any more and is not counted."""
        for seq in seqs:
            saved = seq.restored_from
            if saved is None:
                continue
            tier = "disk" if saved.from_disk else "host"
            saved.from_disk = False  # read once from disk; it is the host tier's from now on
            counters = self.tiers[tier]
            counters.hits += 1
            counters.restored_tokens += seq.num_computed
            counters.restored_bytes += saved.nbytes
            self.restored[seq.request_id] = (seq.num_computed, tier)

    def on_token(self, seq: Sequence, num_tokens: int = 1) -> None:
        """A step's tokens for one sequence: several when it accepted a draft; one inter-token
        gap either way (vLLM counts one per step)."""
        self.counters.generation_tokens += num_tokens
        if seq.last_itl_s is None:
            self._observe(self.ttft, "time_to_first_token_seconds", seq.timings_s()[1])
        else:
            self._observe(self.itl, "inter_token_latency_seconds", seq.last_itl_s)

    def on_preempted(self, seq: Sequence) -> None:
        self.counters.preemptions += 1
        self.restored.pop(seq.request_id, None)
        detail = f"cells freed, will recompute {len(seq.tokens)} tokens"
        self.event("preempted", seq, detail, at=seq.queued_time)

    def on_finished(self, seq: Sequence) -> None:
        self.counters.finished += 1
        self.restored.pop(seq.request_id, None)
        reason = seq.finish_reason
        if reason is FinishReason.CANCELLED:
            self.counters.cancellations += 1
        elif reason is FinishReason.ERROR:
            self.counters.errors += 1
        elif reason is FinishReason.STOP:
            self.counters.finished_stop += 1
        elif reason is FinishReason.LENGTH:
            self.counters.finished_length += 1
        queue_s, _, e2e_s, tpot_s = seq.timings_s()
        if not math.isnan(e2e_s):
            self._observe(self.e2e, "e2e_request_latency_seconds", e2e_s)
        if not math.isnan(tpot_s):
            self._observe(self.tpot, "request_time_per_output_token_seconds", tpot_s)
        h = self.histograms
        h["request_prompt_tokens"].observe(seq.num_prompt_tokens)
        h["request_generation_tokens"].observe(seq.num_output_tokens)
        h["request_params_max_tokens"].observe(seq.params.max_tokens)
        h["request_max_num_generation_tokens"].observe(seq.params.max_tokens)  # n is always 1
        scheduled, first, last = seq.first_scheduled_time, seq.first_token_time, seq.last_token_time
        if scheduled is not None and first is not None and last is not None:
            h["request_prefill_time_seconds"].observe(first - scheduled)
            h["request_decode_time_seconds"].observe(last - first)
            h["request_inference_time_seconds"].observe(last - scheduled)
        detail = f"{reason.value}, {seq.num_output_tokens} tokens"
        detail += f": {seq.error}" if seq.error else ""
        self.event("finished", seq, detail, at=seq.finished_time)

    def on_drafts(
        self, num_drafts: int, num_draft_tokens: int, num_accepted: int, by_position: list[int]
    ) -> None:
        """A step's verified drafts (vLLM's spec_decode series): how many sequences drafted,
        the tokens drafted and accepted, and accepted by position in the draft."""
        c = self.counters
        c.spec_drafts += num_drafts
        c.spec_draft_tokens += num_draft_tokens
        c.spec_accepted_tokens += num_accepted
        per_pos = c.spec_accepted_per_position
        per_pos += [0] * (len(by_position) - len(per_pos))
        for j, n in enumerate(by_position):
            per_pos[j] += n

    def on_embedded(self, num_inputs: int, num_tokens: int) -> None:
        """A step's embedded inputs and their tokens."""
        self.counters.embed_inputs += num_inputs
        self.counters.embed_tokens += num_tokens

    def on_embedding_finished(self, request) -> None:
        """An embedding request's end (localserve.engine.embedding.EmbeddingRequest)."""
        c = self.counters
        if request.finish_reason == "stop":
            c.embed_requests += 1
        elif request.finish_reason == "cancelled":
            c.embed_cancellations += 1
        else:
            c.embed_errors += 1
        detail = f"embedding {request.finish_reason}, {request.num_done}/{len(request.inputs)}"
        detail += f" inputs{': ' + request.error if request.error else ''}"
        self.event("finished", request, detail, at=request.finished_time)

    def on_rejected(self) -> None:
        self.counters.rejections += 1

    def on_step(
        self,
        num_decode: int,
        num_prefill: int,
        step_s: float,
        decode_s: float,
        prefill_s: float,
        num_sampled: int | None = None,
        num_draft: int = 0,
        num_accepted: int = 0,
        is_stretched: bool = False,
        num_embed: int = 0,
        num_embed_inputs: int = 0,
    ) -> None:
        """One step: its token counts, wall time, time in llama_decode, predicted prefill time,
        its draft rows and how many of them were accepted, whether TTFT deadlines stretched
        it past the ITL target's prefill budget, and its embedding tokens and inputs."""
        self.counters.steps += 1
        self.counters.prefill_tokens += num_prefill
        num_tokens = num_decode + num_prefill + num_draft + num_embed
        self.histograms["iteration_tokens_total"].observe(num_tokens)
        sampled = num_decode if num_sampled is None else num_sampled
        record = StepRecord(
            self.clock(),
            num_decode,
            num_prefill,
            sampled,
            step_s,
            decode_s,
            prefill_s,
            num_draft,
            num_accepted,
            is_stretched,
            num_embed,
            num_embed_inputs,
        )
        self.steps.append(record)
        if not num_embed:  # (a shape of its own; the slowdown compares chat steps)
            self.slowdown.add(record.t, num_decode + num_draft, num_prefill, step_s)

    def _observe(self, window: Window, name: str, value: float) -> None:
        window.add(self.clock(), value)
        self.histograms[name].observe(value)

    # --- reading ---------------------------------------------------------------------------

    def latency(self) -> dict[str, Percentiles]:
        now = self.clock()
        named = {"ttft": self.ttft, "itl": self.itl, "queue": self.queue, "e2e": self.e2e}
        named |= {"tpot": self.tpot, "queue_error": self.queue_error}
        named["queue_error_share"] = self.queue_error_share
        return {name: percentiles(w.values(now)) for name, w in named.items()}

    def throughput(self, span_s: float = 10.0) -> tuple[float, float]:
        """(prompt tokens/s, generated tokens/s) over the last `span_s` seconds of steps."""
        now = self.clock()
        recent = [s for s in self.steps if s.t >= now - span_s]
        if not recent:
            return 0.0, 0.0
        elapsed = max(now - recent[0].t + recent[0].step_s, 1e-9)
        prompt = sum(s.num_prefill for s in recent)
        return prompt / elapsed, sum(s.num_sampled for s in recent) / elapsed

    def embed_throughput(self, span_s: float = 10.0) -> tuple[float, float]:
        """(embedded inputs/s, embedded tokens/s) over the last `span_s` seconds of steps."""
        now = self.clock()
        recent = [s for s in self.steps if s.t >= now - span_s]
        if not any(s.num_embed for s in recent):
            return 0.0, 0.0
        elapsed = max(now - recent[0].t + recent[0].step_s, 1e-9)
        inputs = sum(s.num_embed_inputs for s in recent)
        return inputs / elapsed, sum(s.num_embed for s in recent) / elapsed

    def step_stats(self, prefill_budget: int, last_n: int = 32) -> StepStats:
        recent = list(self.steps)[-last_n:]
        if not recent:
            return StepStats(0, None, None, None, None, None, prefill_budget)
        n = len(recent)
        total_s = max(sum(s.step_s for s in recent), 1e-9)
        drafted = sum(s.num_draft for s in recent)
        decodes = sum(s.num_decode for s in recent)
        accepted = sum(s.num_accepted for s in recent)
        return StepStats(
            num_steps=self.counters.steps,
            step_s=total_s / n,
            decode_tokens=sum(s.num_decode for s in recent) / n,
            prefill_tokens=sum(s.num_prefill for s in recent) / n,
            prefill_time_share=min(1.0, sum(s.prefill_s for s in recent) / total_s),
            engine_share=max(0.0, 1 - sum(s.decode_s for s in recent) / total_s),
            prefill_budget=prefill_budget,
            draft_tokens=sum(s.num_draft for s in recent) / n,
            draft_acceptance=accepted / drafted if drafted else None,
            tokens_per_decode=1 + accepted / decodes if decodes else None,
            stretched_share=sum(s.step_s for s in recent if s.is_stretched) / total_s,
            slowdown=self.slowdown.ratio,
        )

    def export_histograms(self) -> dict[str, Histogram]:
        return {name: h.export() for name, h in self.histograms.items()}
