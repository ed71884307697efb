"""An embedding request's inputs bounded before the engine sees them, and its vectors shaped
after: the checks admission (admission.py) makes of an `Embedding` (door.py), with the messages
the front-ends pass on.

Every bound names what broke it: the count past the model's (or the server's) largest request,
the input (by index) whose tokens are past the model's largest input and both numbers, the id
(input and position) outside the vocabulary, `dimensions` outside 1 to n_embd. Texts are
tokenized in the prompt builder's threads (`tokenize_texts` is what runs there), a text far too
long only probed at its head: a 256 KiB string is never tokenized whole to be refused. With
`truncate` (Ollama's default) an input past the bound is cut to it instead.

Tested in tests/unit/serve/test_embedding_inputs.py, and through the endpoints in
tests/unit/serve/openai/test_embeddings.py and tests/e2e/test_embeddings.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy

PROBE_CHARS_PER_TOKEN = 8  # a text this many chars a token long is probed before tokenizing


class EmbedLimits(NamedTuple):
    """One model's bounds on embedding (its ModelInfo's)."""

    n_vocab: int
    n_embd: int
    max_inputs: int  # inputs in one request
    max_tokens: int  # tokens in one input

    @classmethod
    def of(cls, info) -> EmbedLimits:
        """The bounds a loaded model's ModelInfo says."""
        return cls(info.n_vocab, info.n_embd, info.max_embed_inputs, info.max_embed_tokens)


class InputRefused(ValueError):
    """An embedding request refused for its inputs: `code` is admission's ("bad_request", or
    "too_long" for an input past the tokens bound), `param` the field it names."""

    def __init__(self, code: str, message: str, param: str = "input") -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def check_count(num_inputs: int, max_inputs: int) -> None:
    if num_inputs > max_inputs:
        raise InputRefused(
            "bad_request",
            f"input: {num_inputs} inputs; at most {max_inputs} in one request (send them in "
            f"several)",
        )


def check_dimensions(dimensions: int | None, n_embd: int) -> None:
    if dimensions is not None and not 1 <= dimensions <= n_embd:
        raise InputRefused(
            "bad_request",
            f"dimensions: {dimensions} is not between 1 and this model's {n_embd}",
            "dimensions",
        )


def fit_token_lists(
    inputs: Sequence[Sequence[int]], limits: EmbedLimits, truncate: bool
) -> list[list[int]]:
    """Token id inputs checked (not empty, every id in the vocabulary) and fitted to the tokens
    bound (cut with `truncate`, else refused)."""
    fitted = []
    for i, tokens in enumerate(inputs):
        _check_not_empty(i, tokens)
        for j, token in enumerate(tokens):
            if not 0 <= token < limits.n_vocab:
                raise InputRefused(
                    "bad_request",
                    f"input[{i}][{j}]: token id {token} is not in this model's vocabulary "
                    f"(0 to {limits.n_vocab - 1})",
                )
        fitted.append(_fit(i, list(tokens), len(tokens), limits.max_tokens, truncate))
    return fitted


def tokenize_texts(
    texts: Sequence[str], tokenize: Callable[[str], list[int]], max_tokens: int, truncate: bool
) -> list[list[int]]:
    """Texts to tokens (the tokenizer's special tokens added, as llama-server embeds), each
    fitted to `max_tokens`. Run off the event loop (the prompt builder's threads)."""
    probe = max_tokens * PROBE_CHARS_PER_TOKEN
    fitted = []
    for i, text in enumerate(texts):
        at_least = len(text) > probe
        tokens = tokenize(text[:probe] if at_least else text)
        if at_least and len(tokens) <= max_tokens:  # tokens of many characters: count them all
            tokens, at_least = tokenize(text), False
        _check_not_empty(i, tokens)
        fitted.append(_fit(i, tokens, len(tokens), max_tokens, truncate, at_least))
    return fitted


def _check_not_empty(i: int, tokens: Sequence) -> None:
    if not tokens:
        raise InputRefused("bad_request", f"input[{i}]: an empty input has nothing to embed")


def _fit(
    i: int, tokens: list[int], num: int, max_tokens: int, truncate: bool, at_least: bool = False
) -> list[int]:
    if num <= max_tokens:
        return tokens
    if truncate:
        return tokens[:max_tokens]
    over = "over " if at_least else ""
    raise InputRefused(
        "too_long",
        f"input[{i}]: {over}{num} tokens; this model embeds at most {max_tokens} tokens an "
        f"input (send it shorter, or split it)",
    )


def shorten(vectors: list[list[float]], dimensions: int | None) -> list[list[float]]:
    """The vectors cut to their first `dimensions` and L2-normalised again (as OpenAI's
    `dimensions` gives them); None, or their own length: as they are."""
    if dimensions is None or not vectors or dimensions >= len(vectors[0]):
        return vectors
    heads = numpy.asarray(vectors, dtype=numpy.float64)[:, :dimensions]
    norms = numpy.linalg.norm(heads, axis=1, keepdims=True)
    return (heads / numpy.where(norms > 0, norms, 1.0)).tolist()
