"""What a model needs in memory at its models.toml settings, from its GGUF header, before it loads;
and what memory there is.

Three parts, each as llama.cpp (the 0.3.36 vendored sources) sizes it:

- **Weights**: the tensors' bytes (the tensor table's types and shapes). With a GPU, llama.cpp
  puts the last `n_gpu_layers` repeating layers (`blk.N.*`) on the device, and the output layer
  too when every repeating layer is there (n_gpu_layers > block_count, or -1); the token
  embeddings always stay on the host.
- **KV cache**: `n_ctx` padded to 256 cells, times each layer's K and V row
  (head_count_kv x key_length and x value_length) in the cell types. Sliding-window layers
  (Gemma 3: five in six): llama.cpp's `llama_kv_cache_iswa` gives them
  min(n_ctx, pad(n_swa x streams + n_ubatch, 256)) cells unless `swa_full` is set. localserve
  sets `swa_full` (runners/llama.py: a cached prefix must keep its whole history), so every layer
  gets n_ctx cells, and the log says "using full-size SWA cache"; `swa_full=False` is modelled
  for the other case. A layer's cache is on the device when the layer is and `offload_kqv`.
- **Compute buffers**: ggml's allocator reuses a tensor's memory once nothing reads it, so the
  graph's buffer is its widest moment, not the sum of its tensors. Its candidates: the KQ masks
  (n_kv x n_ubatch f16, one per attention kind, alive through the layers), a layer's
  feed-forward (gate and up, n_ubatch x n_ff floats each, beside the hidden state), without
  flash attention the scores (n_head x n_kv x n_ubatch floats; the softmax reuses them), and
  the logits (n_vocab floats per row: localserve sets n_outputs_max to a row per running
  sequence and per draft row, at least n_seq_max; `logit_rows`).
  Which of them are alive at the widest moment depends on the graph: measured on the embedded
  model (docs/benchmarks.md), the buffer was the logits alone at n_ctx 4096 and the masks plus
  the feed-forward plus the logits at n_ctx 16384. So the estimate counts them all at once: an
  upper bound, 0-55% above llama.cpp's compute buffer there (a few percent of the total).
  Besides the graph, llama.cpp keeps an output buffer of logit rows: n_seq_max at start, grown
  to a batch's rows when one asks for more (drafts), so counted here at `logit_rows` too.

Beside llama.cpp's parts, the engine keeps the prefix cache's host tier (saved conversations'
KV state, engine/prefix_tiers.py) in its own RAM, up to its budget (`host_cache_bytes`): the
pool counts it in a model's need (`estimate`'s `host_cache`).

Tested in tests/unit/runners/test_footprint.py and tests/e2e/test_footprint.py.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from localserve.config import ModelConfig
from localserve.runners.gguf_header import ArrayLength, GgufHeader

MIB = 1 << 20
CTX_PAD = 256  # llama.cpp pads n_ctx (and the SWA cache) to a multiple of this
RESERVE_FRACTION = 0.10  # of the memory there is, left to everything else ...
MIN_RESERVE = 512 * MIB  # ... and at least this much
HOST_CACHE_SHARE = 0.125  # the host tier's auto budget: of the available RAM ...
MAX_AUTO_HOST_CACHE = 2048 * MIB  # ... at most this much (~70 conversations of 1,500 tokens
# of the embedded model, two states each; a model's need counts it, so it stays modest)
MAX_AUTO_CACHE = 4096 * MIB  # the disk tier's auto budget at most
_BLOCK = re.compile(r"blk\.(\d+)\.")
# which layers slide, where the GGUF does not say (llama-model.cpp's set_swa_pattern calls):
# every n-th layer (the n-th, 2n-th, ...) attends to the whole context, the others to a window
_SWA_PATTERNS = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4, "llama4": 4}


@dataclass(frozen=True)
class Shape:
    """What the footprint depends on, from the GGUF's metadata."""

    architecture: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_vocab: int
    kv_heads: tuple[int, ...]  # per layer (0: no attention cache, e.g. a recurrent layer)
    key_length: int
    value_length: int
    n_swa: int  # sliding window (0: none)
    swa_layers: frozenset[int]
    context_length: int  # what it was trained for


@dataclass(frozen=True)
class Footprint:
    """Bytes on the device (a GPU; 0 on a CPU build) and on the host, by part."""

    weights_device: int
    weights_host: int
    kv_device: int
    kv_host: int
    compute_device: int
    compute_host: int
    n_cells: int
    cache_host: int = 0  # the prefix cache's host tier (its budget), in the engine's RAM

    @property
    def device(self) -> int:
        return self.weights_device + self.kv_device + self.compute_device

    @property
    def host(self) -> int:
        return self.weights_host + self.kv_host + self.compute_host + self.cache_host

    @property
    def kv(self) -> int:
        return self.kv_device + self.kv_host

    @property
    def total(self) -> int:
        return self.device + self.host


def _per_layer(value, n_layer: int) -> tuple[int, ...]:
    if isinstance(value, list):
        return tuple(int(v) for v in value[:n_layer])
    return (int(value),) * n_layer


def shape(header: GgufHeader) -> Shape:
    """The model's shape; ValueError naming a missing key."""
    arch = header.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError("the GGUF names no general.architecture")

    def key(name: str, default=None):
        value = header.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"the GGUF has no {arch}.{name}")
        return value

    n_layer, n_embd = int(key("block_count")), int(key("embedding_length"))
    heads = _per_layer(key("attention.head_count"), n_layer)
    n_head = max(heads) or 1
    kv_heads = _per_layer(key("attention.head_count_kv", key("attention.head_count")), n_layer)
    tokens = header.get("tokenizer.ggml.tokens")
    n_vocab = header.get(f"{arch}.vocab_size") or (
        tokens.length if isinstance(tokens, ArrayLength) else len(tokens or [])
    )
    n_ff = key("feed_forward_length", 4 * n_embd)
    n_swa = int(header.get(f"{arch}.attention.sliding_window", 0) or 0)
    pattern = header.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):  # per layer, true where the layer slides
        swa = frozenset(i for i, slides in enumerate(pattern) if slides)
    elif n_swa and arch in _SWA_PATTERNS:
        every = _SWA_PATTERNS[arch]
        swa = frozenset(i for i in range(n_layer) if (i + 1) % every)
    else:  # not known: every layer counted as a full one (an over-estimate, never an under-)
        swa = frozenset()
    return Shape(
        architecture=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=max(_per_layer(n_ff, n_layer)),
        n_head=n_head,
        n_vocab=int(n_vocab),
        kv_heads=kv_heads,
        key_length=int(key("attention.key_length", n_embd // n_head)),
        value_length=int(key("attention.value_length", n_embd // n_head)),
        n_swa=n_swa,
        swa_layers=swa,
        context_length=int(key("context_length", 0)),
    )


def cell_bytes(kind: str, n_values: int) -> int:
    """Bytes of `n_values` numbers in a KV cell type (f16, q8_0, q4_0: ggml's block sizes)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind.upper()]]
    return -(-n_values // block) * size


def padded(n: int) -> int:
    return -(-n // CTX_PAD) * CTX_PAD


def _on_device(layer: int, n_layer: int, n_gpu: int) -> bool:
    """llama.cpp offloads the last n_gpu layers (i_gpu_start = n_layer - n_gpu)."""
    return layer >= n_layer - n_gpu


def weights(header: GgufHeader, n_layer: int, n_gpu: int) -> tuple[int, int]:
    """(device, host) bytes of the tensors, with `n_gpu` layers offloaded (0 on a CPU build)."""
    device = host = 0
    for t in header.tensors:
        m = _BLOCK.match(t.name)
        if m:
            here = _on_device(int(m[1]), n_layer, n_gpu)
        else:  # the output layer (output, output_norm) goes with "layer n_layer"
            here = not t.name.startswith("token_embd") and n_gpu > n_layer
        if here:
            device += t.n_bytes
        else:
            host += t.n_bytes
    return device, host


def estimate(
    header: GgufHeader,
    cfg: ModelConfig,
    gpu: bool = False,
    swa_full: bool = True,
    host_cache: int = 0,
):
    """The footprint of a model at its settings. `gpu`: a llama.cpp that can offload (a CUDA
    build with a device); on a CPU build everything is on the host. `host_cache`: the prefix
    cache's host tier (`host_cache_bytes`; 0 = llama.cpp's parts alone)."""
    s = shape(header)
    n_gpu = 0 if not gpu else s.n_layer + 1 if cfg.n_gpu_layers < 0 else cfg.n_gpu_layers
    w_dev, w_host = weights(header, s.n_layer, n_gpu)
    n_cells = padded(cfg.n_ctx)
    kv_dev, kv_host = kv_bytes(s, cfg, n_cells, n_gpu, swa_full)
    compute = compute_bytes(s, cfg, n_cells)
    # the device holds the graph when layers are there; the host then keeps a small buffer for
    # the inputs (the ubatch's embeddings and masks: the device's share is an over-estimate)
    on_device = n_gpu > 0
    host_part = cfg.max_num_batched_tokens * s.n_embd * 4
    return Footprint(
        weights_device=w_dev,
        weights_host=w_host,
        kv_device=kv_dev,
        kv_host=kv_host,
        compute_device=compute if on_device else 0,
        compute_host=host_part if on_device else compute,
        n_cells=n_cells,
        cache_host=host_cache,
    )


def host_cache_bytes(cfg: ModelConfig, free: int | None = None) -> int:
    """The prefix cache's host tier budget: host_cache_mib, or (-1, auto) an eighth of the
    available RAM (`free`, else read now), at most MAX_AUTO_HOST_CACHE; 0 for an embedding
    model."""
    if cfg.kind == "embedding" or cfg.host_cache_mib == 0:
        return 0
    if cfg.host_cache_mib > 0:
        return cfg.host_cache_mib * MIB
    free = host_available().free if free is None else free
    return min(int(free * HOST_CACHE_SHARE), MAX_AUTO_HOST_CACHE)


def kv_bytes(s: Shape, cfg: ModelConfig, n_cells: int, n_gpu: int = 0, swa_full: bool = True):
    """(device, host) bytes of the KV cache for n_cells cells (see the module's docstring)."""
    n_ubatch = cfg.max_num_batched_tokens
    swa_cells = n_cells if swa_full else min(n_cells, padded(s.n_swa + n_ubatch))
    device = host = 0
    for layer, heads in enumerate(s.kv_heads):
        row = cell_bytes(cfg.cache_type_k, heads * s.key_length) + cell_bytes(
            cfg.cache_type_v, heads * s.value_length
        )
        size = row * (swa_cells if layer in s.swa_layers else n_cells) if heads else 0
        if cfg.offload_kqv and _on_device(layer, s.n_layer, n_gpu):
            device += size
        else:
            host += size
    return device, host


def logit_rows(cfg: ModelConfig) -> int:
    """llama.cpp's n_outputs_max: a row per running sequence and per draft row, and at least
    n_seq_max (llama.cpp asserts it)."""
    return max(cfg.max_num_seqs + cfg.max_cached_prefixes, cfg.max_num_seqs + cfg.draft_rows)


def compute_bytes(s: Shape, cfg: ModelConfig, n_cells: int) -> int:
    """The graph's buffer (an upper bound) plus the output buffer: the module's docstring."""
    n_ubatch = cfg.max_num_batched_tokens
    logits = logit_rows(cfg) * s.n_vocab * 4
    masks = (2 if s.swa_layers else 1) * n_cells * n_ubatch * 2
    hidden = n_ubatch * s.n_embd * 4
    ffn = 2 * n_ubatch * s.n_ff * 4 + 2 * hidden
    # "auto": llama.cpp turns flash attention on where the device has it (the CPU does)
    scores = s.n_head * n_cells * n_ubatch * 4 if cfg.flash_attn == "off" else 0
    return masks + max(ffn, scores) + logits + logits


@dataclass(frozen=True)
class Available:
    """Memory there is for a model: where, how much is free, and what is kept back."""

    where: str  # "RAM", or the device's name (CUDA0)
    free: int
    reserve: int

    @property
    def usable(self) -> int:
        return max(0, self.free - self.reserve)


def reserve_for(free: int) -> int:
    return max(MIN_RESERVE, int(free * RESERVE_FRACTION))


def host_available(meminfo: Path = Path("/proc/meminfo")) -> Available:
    """The machine's available RAM (MemAvailable: free plus what the kernel can reclaim)."""
    free = 0
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    if not free:  # not Linux: free pages only (an under-estimate: caches not counted)
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return Available("RAM", free, reserve_for(free))


def device_available(main_gpu: int = 0) -> Available | None:
    """A local GPU's free memory as ggml's backend reports it (ggml_backend_dev_memory: on CUDA,
    cudaMemGetInfo); None on a CPU build. Untested here: these machines have no GPU."""
    from localserve.runners import rpc  # loads llama.cpp

    gpus = [d for d in rpc.devices() if d.kind in ("GPU", "iGPU") and not d.is_remote]
    if not gpus:
        return None
    dev = gpus[min(main_gpu, len(gpus) - 1)]
    return Available(dev.name, dev.free_bytes, reserve_for(dev.free_bytes))


def counted(need: Footprint, gpu: bool) -> int:
    """The part of a footprint that must fit in the memory `available` reports."""
    return need.device if gpu else need.total


def largest_context(header: GgufHeader, cfg: ModelConfig, usable: int, gpu: bool = False) -> int:
    """The most KV cells (a multiple of 256, at most the trained context and localserve's cap)
    whose footprint fits in `usable` bytes at these settings; 0 when not even 256 do."""
    import msgspec

    top = min(shape(header).context_length or (1 << 20), 1 << 20) // CTX_PAD
    lo, hi = 0, top
    while lo < hi:  # the footprint grows with n_ctx: the largest that fits
        mid = (lo + hi + 1) // 2
        trial = msgspec.structs.replace(cfg, n_ctx=mid * CTX_PAD)
        if counted(estimate(header, trial, gpu), gpu) <= usable:
            lo = mid
        else:
            hi = mid - 1
    return lo * CTX_PAD


def capacity(header: GgufHeader, cfg: ModelConfig, usable: int, gpu: bool, kv_type: str):
    """(largest context, parallel sequences) with K and V cells of `kv_type`: the sequences are
    how many of this model's share per sequence (n_ctx / max_num_seqs) that context holds."""
    import msgspec

    trial = msgspec.structs.replace(cfg, cache_type_k=kv_type, cache_type_v=kv_type)
    cells = largest_context(header, trial, usable, gpu)
    share = max(1, cfg.n_ctx // cfg.max_num_seqs)
    return cells, min(cells // share, 256)
