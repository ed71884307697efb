"""The runners that do the engine's tensor work: llama.cpp (with its sampling, placement,
RPC workers and model resolution) and the fake used to test the engine without a model.

- `llama.py`: the llama.cpp runner: one context, raw batches, sampling, cell operations.
- `llama_embed.py`: the llama.cpp runner's embedding context: pooled, normalised vectors.
- `llama_text.py`: a llama.cpp model's text side: tokens, its chat template; `VocabOnly`.
- `llama_backend.py`: llama.cpp's set-up, once a process: its logs routed, its backend up;
  the llama_batch both contexts fill through numpy (`LlamaBatch`).
- `sampling.py`: token sampling over one row of logits, in numpy.
- `grammar.py`: constrained sampling with llguidance, one matcher per constrained request.
- `placement.py`: what runs where: the backend, its devices, the layers, the KV cache.
- `rpc.py`: llama.cpp's devices and its RPC backend, through ctypes.
- `models.py`: a models.toml entry resolved to a verified GGUF file on disk.
- `hub.py`: GGUF files on the Hugging Face Hub: listed, sized, fetched.
- `gguf_header.py`: a GGUF file's metadata and tensor table, read without loading it.
- `footprint.py`: what a model needs in memory before it loads, and what memory there is.
- `prefix_disk.py`: the prefix cache's disk tier (`PrefixDiskTier`), written behind and read
  back on demand; the tiers' budgets, and a model's tiers opened for its engine.
- `prefix_files.py`: the disk tier's files: where they are, what a saved state depends on (its
  identity), one file's format, written atomically and read back checked.
- `fake.py`: a deterministic fake runner, to test the scheduler and the engine.
"""
