"""An llguidance tokenizer of one token per byte (and an end), to walk a grammar byte by byte:
what a grammar makes impossible is then checked character by character, whatever a real
vocabulary's tokens would group."""

from __future__ import annotations

import llguidance


def bytes_tokenizer() -> llguidance.LLTokenizer:
    from llguidance._tokenizer import TokenizerWrapper

    class _Bytes:
        eos_token_id, bos_token_id, special_token_ids = 256, None, [256]
        tokens = [bytes([i]) for i in range(256)] + [b"\xff<end>"]

        def __call__(self, data: bytes) -> list[int]:
            return self.tokenize(data)

        def tokenize(self, data: bytes | str) -> list[int]:
            return list(data.encode() if isinstance(data, str) else data)

    return llguidance.LLTokenizer(TokenizerWrapper(_Bytes()))
