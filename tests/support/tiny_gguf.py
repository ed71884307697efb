"""A tiny GGUF written with gguf-py: Gemma 3's metadata keys at toy sizes, a few tensors, no
usable weights: for reading headers and estimating memory, not for loading."""

from __future__ import annotations

import numpy as np
from gguf import GGUFWriter


def tiny_gguf(path, n_layer=4, vocab=2000):
    w = GGUFWriter(str(path), "gemma3")
    w.add_block_count(n_layer)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_key_length(32)
    w.add_value_length(32)
    w.add_sliding_window(16)
    w.add_context_length(4096)
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_tensor("token_embd.weight", np.zeros((vocab, 64), dtype=np.float32))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.ffn_up.weight", np.zeros((128, 64), dtype=np.float16))
    w.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
