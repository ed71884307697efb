"""The one seam to the hardware: what the engine needs from a model runner.

`localserve.llama_runner.LlamaRunner` implements it over llama.cpp; `localserve.fake_runner`
has a deterministic fake for logic tests. Every llama_cpp call lives behind this protocol.
"""

from __future__ import annotations

from typing import Any, Protocol

from localserve.protocol import ModelInfo
from localserve.scheduler import Batch
from localserve.sequence import SamplingParams


class KVCacheFull(Exception):
    """llama_decode returned 1: no free KV slot for the batch; nothing was computed."""


class SamplingError(ValueError):
    """No valid token could be drawn for one sequence; that sequence fails, no other."""


class DecodeError(Exception):
    """llama_decode failed (aborted, invalid batch or a fatal error); the batch is lost."""


class Runner(Protocol):
    info: ModelInfo
    last_decode_s: float  # time spent inside the model in the last run()
    supports_prefix_reuse: bool  # can a sequence be cut back to a prefix (trim_seq)?

    def tokenize(self, text: str, add_special: bool = True) -> list[int]: ...

    def apply_chat_template(self, messages: list[dict[str, str]]) -> str: ...

    def piece(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...

    def new_sampler(self, params: SamplingParams) -> Any: ...

    def free_sampler(self, sampler: Any) -> None: ...

    def run(self, batch: Batch) -> list[int | SamplingError]:
        """Decode the batch; return one sampled token per item that wants logits, in order.

        A row that could not be sampled gets its `SamplingError` in place of a token.
        """
        ...

    def free_seq(self, seq_id: int) -> None: ...

    def trim_seq(self, seq_id: int, num_tokens: int) -> bool:
        """Keep a sequence's positions [0, num_tokens); False if the memory cannot."""
        ...

    def copy_seq(self, src: int, dst: int, num_tokens: int) -> None:
        """Share positions [0, num_tokens) of `src` with `dst` (free in a unified cache)."""
        ...

    def seq_num_cells(self, seq_id: int) -> int:
        """Cells the cache holds for a sequence (from its position range)."""
        ...

    def close(self) -> None: ...
