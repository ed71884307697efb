"""A GGUF header read without loading the model (gguf_header.py), and the memory a model needs
from it (footprint.py), on small GGUFs written with gguf-py."""

from __future__ import annotations

import pytest
from gguf import GGUFReader

from localserve.config import ModelConfig
from localserve.runners.footprint import (
    MIB,
    cell_bytes,
    estimate,
    host_available,
    host_cache_bytes,
    shape,
)
from localserve.runners.gguf_header import ArrayLength, TruncatedHeader, parse_header, read_header
from tests.support.tiny_gguf import tiny_gguf


def test_the_header_agrees_with_gguf_py(tmp_path):
    path = tiny_gguf(tmp_path / "m.gguf")
    header, reader = read_header(path), GGUFReader(str(path))
    assert header.tensor_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    assert header.get("gemma3.block_count") == 4
    assert header.get("tokenizer.ggml.tokens") == ArrayLength(2000)  # long: counted, not kept
    assert header.data_offset == reader.data_offset


def test_a_cut_header_asks_for_more_and_a_non_gguf_is_named(tmp_path):
    data = tiny_gguf(tmp_path / "m.gguf").read_bytes()
    with pytest.raises(TruncatedHeader):
        parse_header(data[:5000])
    with pytest.raises(ValueError, match="not a GGUF"):
        parse_header(b"<html>nope</html>")


def test_the_estimate_counts_weights_kv_and_compute(tmp_path):
    header = read_header(tiny_gguf(tmp_path / "m.gguf"))
    s = shape(header)
    assert s.swa_layers == frozenset({0, 1, 2, 3}) - {5}  # gemma3: every 6th layer is global
    cfg = ModelConfig(path="m.gguf", n_ctx=1000)  # padded to 1024 cells
    e = estimate(header, cfg)
    assert e.n_cells == 1024 and e.device == 0
    assert e.weights_host == header.tensor_bytes
    assert e.kv == 4 * 1024 * 2 * 32 * 2  # layers x cells x (K, V) x 32 values x f16
    q8 = estimate(header, ModelConfig(path="m.gguf", n_ctx=1000, cache_type_k="q8_0"))
    assert q8.kv == 4 * 1024 * (cell_bytes("q8_0", 32) + 64)
    # sliding-window layers get a window's cells unless swa_full (localserve's setting)
    assert estimate(header, cfg, swa_full=False).kv < e.kv


def test_a_gpu_takes_the_last_layers_and_their_cache(tmp_path):
    header = read_header(tiny_gguf(tmp_path / "m.gguf"))
    half = estimate(header, ModelConfig(path="m.gguf", n_gpu_layers=2), gpu=True)
    assert half.weights_device == 2 * 128 * 64 * 2 and half.kv_device == half.kv_host
    every = estimate(header, ModelConfig(path="m.gguf"), gpu=True)
    assert every.weights_host == 2000 * 64 * 4  # the token embeddings stay on the host
    assert every.compute_device > every.compute_host > 0


def test_available_ram_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable:   8388608 kB\n")
    avail = host_available(meminfo)
    assert avail.free == 8 << 30 and avail.usable == avail.free - avail.reserve
    assert avail.reserve >= 512 * MIB


def test_the_prefix_cache_s_host_tier_is_counted_in_ram(tmp_path):
    header = read_header(tiny_gguf(tmp_path / "m.gguf"))
    cfg = ModelConfig(path="m.gguf", host_cache_mib=64)
    bare, cached = estimate(header, cfg), estimate(header, cfg, host_cache=host_cache_bytes(cfg))
    assert cached.total - bare.total == cached.host - bare.host == 64 * MIB
    on_gpu = estimate(header, cfg, gpu=True, host_cache=64 * MIB)
    assert on_gpu.device == estimate(header, cfg, gpu=True).device  # RAM, not the GPU's
    auto = ModelConfig(path="m.gguf")
    assert host_cache_bytes(auto, free=1 << 30) == 128 * MIB  # an eighth of what is free ...
    assert host_cache_bytes(auto, free=64 << 30) == 2048 * MIB  # ... at most 2 GiB
    assert host_cache_bytes(ModelConfig(path="m.gguf", kind="embedding")) == 0
