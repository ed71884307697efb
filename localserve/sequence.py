"""A request's life inside the engine: tokens, KV position, sampling settings, text and timings.

Pure data and logic, no llama.cpp: the runner supplies token pieces (bytes) and end-of-generation
flags; `Sequence.append_token` turns them into streamed text, applying stop strings, and decides
when the sequence is finished.
"""

from __future__ import annotations

import codecs
import enum
import math

import msgspec

from localserve.protocol import SAMPLING_FIELDS


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"  # end-of-generation token or a stop string
    LENGTH = "length"  # max_tokens, or the context is full
    CANCELLED = "cancelled"
    ERROR = "error"  # the engine failed this request


MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256  # each stop string is searched in every token's text: keep that cheap
# Temperatures below this are greedy, as in vLLM: dividing float32 logits by less can overflow to
# inf and turn the probabilities into NaN.
MIN_TEMPERATURE = 1e-5
MIN_REPEAT_PENALTY = 0.01  # llama.cpp divides positive logits by it (0 would give inf)
# A draw considers at most this many of the most likely tokens, whatever top_k says: sorting all
# 262,144 of Gemma's costs ~30 ms a token, and one user's request would slow every step.
MAX_CANDIDATES = 1024


class SamplingParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Per-request sampling; temperature 0 (or below MIN_TEMPERATURE) means greedy.

    Every value that passes these checks is safe for both samplers (numpy and llama.cpp's
    float32 chain): nothing a client sends can make a step produce NaN or overflow.
    """

    max_tokens: int = 256
    temperature: float = 0.8
    top_k: int = 40  # 0 = off (then MAX_CANDIDATES, as for any larger value)
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0  # 1 = off
    frequency_penalty: float = 0.0  # OpenAI's: minus this times the count of a token so far
    presence_penalty: float = 0.0  # OpenAI's: minus this once a token has appeared
    repeat_last_n: int = 64
    seed: int | None = None  # None = random
    stop: tuple[str, ...] = ()  # the client's stop strings
    format_stop: tuple[str, ...] = ()  # the chat format's own (not counted against the limit)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        # runs on direct construction and on msgspec decoding (as a ValidationError)
        stops_ok = len(self.stop) <= MAX_STOP_STRINGS and all(
            0 < len(s) <= MAX_STOP_CHARS for s in self.stop + self.format_stop
        )
        checks = [
            (1 <= self.max_tokens <= 1 << 20, "max_tokens", "must be between 1 and 1048576"),
            (0 <= self.temperature <= 100, "temperature", "must be between 0 and 100"),
            (0 <= self.top_k < 1 << 31, "top_k", "must be in [0, 2**31) (0 = off)"),
            (0 < self.top_p <= 1, "top_p", "must be in (0, 1]"),
            (0 <= self.min_p <= 1, "min_p", "must be in [0, 1]"),
            (
                MIN_REPEAT_PENALTY <= self.repeat_penalty <= 10,
                "repeat_penalty",
                f"must be in [{MIN_REPEAT_PENALTY}, 10]",
            ),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty", "must be in [-2, 2]"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty", "must be in [-2, 2]"),
            (0 <= self.repeat_last_n <= 4096, "repeat_last_n", "must be in [0, 4096]"),
            (self.seed is None or 0 <= self.seed < 1 << 32, "seed", "must be in [0, 2**32)"),
            (
                stops_ok,
                "stop",
                f"at most {MAX_STOP_STRINGS} strings of 1-{MAX_STOP_CHARS} characters",
            ),
        ]
        for ok, key, problem in checks:
            if not ok:
                raise ValueError(f"{key}: {problem}")

    @property
    def has_penalties(self) -> bool:
        """Penalties need the token history: llama.cpp's sampler chain applies them."""
        return (self.repeat_penalty, self.frequency_penalty, self.presence_penalty) != (1, 0, 0)

    @property
    def is_greedy(self) -> bool:
        """Argmax sampling with nothing that needs a sampler chain."""
        return self.temperature < MIN_TEMPERATURE and not self.has_penalties

    @property
    def num_candidates(self) -> int:
        """How many of the most likely tokens a draw considers at most."""
        return min(self.top_k or MAX_CANDIDATES, MAX_CANDIDATES)

    @property
    def all_stops(self) -> tuple[str, ...]:
        return self.stop + self.format_stop


def sampling_params(fields, **extra) -> SamplingParams:
    """The engine's checked parameters from a request's `protocol.SamplingFields`.

    Raises ValueError naming the first field out of range.
    """
    values = {name: getattr(fields, name) for name in SAMPLING_FIELDS}
    values["stop"] = tuple(values["stop"])
    return SamplingParams(**values, **extra)


class TextStream:
    """Incremental UTF-8 decoding with stop strings: holds back text that may begin a stop."""

    def __init__(self, stop: tuple[str, ...]) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = stop
        self._pending = ""
        self.text = ""  # everything released so far

    def push(self, piece: bytes) -> tuple[str, bool]:
        """Add a token's bytes; return (text safe to release, whether a stop string was hit)."""
        self._pending += self._decoder.decode(piece)
        if not self._stop:
            return self._release(len(self._pending)), False
        hits = [i for i in (self._pending.find(s) for s in self._stop) if i >= 0]
        if hits:
            delta = self._release(min(hits))
            self._pending = ""
            return delta, True
        return self._release(len(self._pending) - self._held_back()), False

    def flush(self) -> str:
        """Release everything held back (the sequence ended without a stop string)."""
        self._pending += self._decoder.decode(b"", final=True)
        return self._release(len(self._pending))

    def _held_back(self) -> int:
        """Length of the longest suffix of pending text that is a proper prefix of a stop."""
        p = self._pending
        for n in range(min(len(p), max(map(len, self._stop)) - 1), 0, -1):
            if any(s.startswith(p[-n:]) for s in self._stop):
                return n
        return 0

    def _release(self, n: int) -> str:
        out, self._pending = self._pending[:n], self._pending[n:]
        self.text += out
        return out


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
        "system",
        "num_system",
        "system_tokens",
        "system_is_global",
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
        # prefix caching (see localserve.kv): prompt tokens reused from a cached prefix at
        # admission; the cached system prompt whose cells its first `num_system` positions are;
        # and the length of a system prompt at the start of its tokens that other requests may
        # share (every user's with `system_is_global`: the configured one)
        self.cached_tokens = 0
        self.system = None
        self.num_system = 0
        self.system_tokens = 0
        self.system_is_global = False
        self.sampler = None  # runner-owned sampling state
        self.stream = TextStream(params.all_stops)
        self.unsent = ""  # text released by the stream, not yet taken by an event
        self.num_preemptions = 0
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

    def append_token(self, token: int, piece: bytes, is_eog: bool, now: float) -> None:
        """Accept a sampled token; the text it releases waits in `unsent`."""
        if self.first_token_time is None:
            self.first_token_time = now
        else:
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
        return {"queue_ms": queue, "ttft_ms": ttft, "itl_ms": tpot, "e2e_ms": e2e}
