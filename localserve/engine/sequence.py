"""A request's life inside the engine: tokens, KV position, status, text and timings.

Pure data and logic, no llama.cpp: the runner supplies token pieces (bytes) and end-of-generation
flags; `Sequence.append_token` turns them into streamed text
(localserve.engine.text_stream), applying
stop strings (and dropping the chat format's leading space), and decides when the sequence is
finished.
"""

from __future__ import annotations

import enum
import math

from localserve.engine.sampling_params import SamplingParams
from localserve.engine.text_stream import TextStream


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"  # end-of-generation token or a stop string
    LENGTH = "length"  # max_tokens, or the context is full
    CANCELLED = "cancelled"
    ERROR = "error"  # the engine failed this request


class Sequence:
    """One request in the engine. Owned by the engine thread once added."""

    __slots__ = (
        "request_id",
        "client_id",
        "user",
        "params",
        "tokens",
        "num_prompt_tokens",
        "max_total_tokens",
        "status",
        "finish_reason",
        "seq_id",
        "num_computed",
        "num_cells",
        "sampler",
        "stream",
        "unsent",
        "error",
        "is_cancelled",
        "num_preemptions",
        "arrival_time",
        "queued_time",
        "first_scheduled_time",
        "first_token_time",
        "last_token_time",
        "finished_time",
        "queue_s",
        "last_itl_s",
        "cached_tokens",
        "restored_from",
        "exact_from",
        "system",
        "num_system",
        "system_tokens",
        "system_is_global",
        "drafter",
        "draft_stats",
        "num_draft_tokens",
        "num_accepted_tokens",
        "wait_prediction",
    )

    def __init__(
        self,
        request_id: str,
        prompt_tokens: list[int],
        params: SamplingParams,
        user: str = "",
        arrival_time: float = 0.0,
        max_total_tokens: int = 1 << 30,
    ) -> None:
        if not prompt_tokens:
            raise ValueError("prompt: empty prompt (no tokens)")
        self.request_id = request_id
        self.client_id = request_id  # the id its client gave it (the server sets it)
        self.user = user
        self.params = params
        self.tokens = list(prompt_tokens)  # prompt, then generated tokens
        self.num_prompt_tokens = len(prompt_tokens)
        self.max_total_tokens = max_total_tokens  # positions available (the context size)
        self.status = Status.WAITING
        self.finish_reason: FinishReason | None = None
        self.error = ""
        self.is_cancelled = False
        self.seq_id: int | None = None  # llama.cpp sequence id while it holds cells
        self.num_computed = 0  # tokens whose KV is in the cache
        self.num_cells = 0  # cells committed to it (>= num_computed)
        # prefix caching (see localserve.engine.kv): prompt tokens reused from a cached prefix at
        # admission; the cached system prompt whose cells its first `num_system` positions are;
        # and the length of a system prompt at the start of its tokens that other requests may
        # share (every user's with `system_is_global`: the configured one)
        self.cached_tokens = 0
        self.restored_from = None  # the saved prefix (prefix_tiers.SavedPrefix) it restored
        # a restored state has only the last `window` cells of sliding-window layers: its cells
        # may be cut back and continued exactly only at this length or more (0: anywhere)
        self.exact_from = 0
        self.system = None
        self.num_system = 0
        self.system_tokens = 0
        self.system_is_global = False
        # speculative decoding (localserve.engine.speculative): made at its first drafted step
        self.drafter = None
        self.draft_stats = None
        self.num_draft_tokens = 0  # drafted tokens verified for it, and those accepted
        self.num_accepted_tokens = 0
        self.sampler = None  # runner-owned sampling state
        self.stream = TextStream(params.all_stops, params.strip_space)
        self.unsent = ""  # text released by the stream, not yet taken by an event
        self.num_preemptions = 0
        # the first prediction of its wait (localserve.engine.waits): when it was made, and the
        # seconds from then it predicted; None when it never waited for one
        self.wait_prediction: tuple[float, float] | None = None
        # timestamps (monotonic seconds); None until they happen
        self.arrival_time = arrival_time
        self.queued_time: float | None = arrival_time
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.finished_time: float | None = None
        self.queue_s = 0.0  # time spent waiting, re-queues after preemption included
        self.last_itl_s: float | None = None  # gap before the latest token; None at the first

    def __repr__(self) -> str:
        return f"Sequence({self.request_id!r}, user={self.user!r}, {self.status.value})"

    @property
    def num_output_tokens(self) -> int:
        return len(self.tokens) - self.num_prompt_tokens

    @property
    def num_remaining(self) -> int:
        """Tokens not yet in the KV cache (1 while decoding)."""
        return len(self.tokens) - self.num_computed

    @property
    def is_prefilling(self) -> bool:
        return self.num_remaining > 1

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def mark_scheduled(self, now: float) -> None:
        """Record the end of a wait in the queue (first admission or after a preemption)."""
        if self.queued_time is not None:
            self.queue_s += now - self.queued_time
            self.queued_time = None
        if self.first_scheduled_time is None:
            self.first_scheduled_time = now

    def mark_preempted(self, now: float) -> None:
        """Back to waiting with every token so far; its KV will be recomputed."""
        self.status = Status.WAITING
        self.num_computed = 0
        self.queued_time = now
        self.num_preemptions += 1

    def append_token(
        self,
        token: int,
        piece: bytes,
        is_eog: bool,
        now: float,
        is_last: bool = False,
        same_step: bool = False,
    ) -> None:
        """Accept a sampled token; the text it releases waits in `unsent`. `is_last`: the
        request's grammar allows nothing after it, so the reply ends here ("stop").
        `same_step`: another token of this step came before it (an accepted draft): the gap
        before the step stays the latest inter-token latency, as vLLM counts one per step."""
        if self.first_token_time is None:
            self.first_token_time = now
        elif not same_step:
            self.last_itl_s = now - self.last_token_time
        self.last_token_time = now
        self.tokens.append(token)
        if is_eog and not self.params.ignore_eos:  # counted in usage, never streamed
            self.finish(FinishReason.STOP, now)
            self.unsent += self.stream.flush()
            return
        delta, hit_stop = self.stream.push(piece)
        self.unsent += delta
        if hit_stop:
            self.finish(FinishReason.STOP, now)
        elif is_last:
            self.finish(FinishReason.STOP, now)
            self.unsent += self.stream.flush()
        elif self.num_output_tokens >= self.params.max_tokens or (
            len(self.tokens) >= self.max_total_tokens
        ):
            self.finish(FinishReason.LENGTH, now)
            self.unsent += self.stream.flush()

    def take_text(self) -> str:
        """The text released since the last call (may be empty)."""
        text, self.unsent = self.unsent, ""
        return text

    def finish(self, reason: FinishReason, now: float, error: str = "") -> None:
        self.status = Status.FINISHED
        self.finish_reason = reason
        self.finished_time = now
        self.error = error

    def timings_s(self) -> tuple[float, float, float, float]:
        """(queue, TTFT, e2e, TPOT) in seconds, vLLM definitions; NaN where not applicable."""
        first, last, end = self.first_token_time, self.last_token_time, self.finished_time
        n = self.num_output_tokens
        return (
            self.queue_s,
            first - self.arrival_time if first is not None else math.nan,
            end - self.arrival_time if end is not None else math.nan,
            (last - first) / (n - 1) if first is not None and n > 1 else math.nan,
        )

    def timings(self) -> dict[str, float]:
        """The `done` frame's timings in milliseconds (itl_ms is the mean gap, i.e. TPOT)."""
        queue, ttft, e2e, tpot = (x * 1e3 for x in self.timings_s())
        timings = {"queue_ms": queue, "ttft_ms": ttft, "itl_ms": tpot, "e2e_ms": e2e}
        if self.num_draft_tokens:  # llama-server's names for them
            timings["draft_n"] = float(self.num_draft_tokens)
            timings["draft_n_accepted"] = float(self.num_accepted_tokens)
        if self.wait_prediction is not None:  # the queue time its first prediction said
            made_at, wait_s = self.wait_prediction
            timings["predicted_queue_ms"] = (made_at - self.arrival_time + wait_s) * 1e3
        return timings
