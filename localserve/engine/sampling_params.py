"""A request's sampling parameters, checked: every value that passes is safe for both samplers."""

from __future__ import annotations

import msgspec

from localserve.protocol.frames import SAMPLING_FIELDS

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256  # each stop string is searched in every token's text: keep that cheap
# Temperatures below this are greedy, as in vLLM: dividing float32 logits by less can overflow to
# inf and turn the probabilities into NaN.
MIN_TEMPERATURE = 1e-5
MIN_REPEAT_PENALTY = 0.01  # llama.cpp divides positive logits by it (0 would give inf)
# A draw considers at most this many of the most likely tokens, whatever top_k says: sorting all
# 262,144 of Gemma's costs ~30 ms a token, and one user's request would slow every step.
MAX_CANDIDATES = 1024


class Constraint(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a reply must match, as a compiled grammar the runner's grammar engine follows.

    `grammar` is llguidance's grammar text (its JSON form, made by `localserve.chat.constraints`
    from a JSON schema, "any JSON object" or a Lark grammar, and checked there: bounded and
    validated before it reaches the engine). `kind` says which ("json_object", "json_schema",
    "lark"), for logs and metrics. The constraint applies to its own request's tokens only.
    """

    kind: str
    grammar: str


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
    # the chat format's replies start with a space of its own ("Assistant: ..."): not streamed
    strip_space: bool = False
    ignore_eos: bool = False
    constraint: Constraint | None = None  # structured output: the reply follows this grammar

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
    def is_seeded(self) -> bool:
        """A sampled reply the client asked to repeat (a seed): the same reply each time from
        the same numerics."""
        return self.seed is not None and self.temperature >= MIN_TEMPERATURE

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
