"""What runs where, read from llama.cpp's own log lines (placement.py)."""

from __future__ import annotations

from localserve import placement
from localserve.placement import describe, gpu_without_offload, parse_log

CPU_LOG = """\
load_tensors:   CPU_Mapped model buffer size =   235.16 MiB
llama_context: flash_attn            = auto
llama_kv_cache:        CPU KV buffer size =    12.00 MiB
llama_kv_cache: size =   12.00 MiB (  4096 cells,   3 layers, 32/1 seqs), K (f16):    6.00 MiB, V (f16):    6.00 MiB
llama_kv_cache:        CPU KV buffer size =    60.00 MiB
llama_kv_cache: size =   60.00 MiB (  4096 cells,  15 layers, 32/1 seqs), K (f16):   30.00 MiB, V (f16):   30.00 MiB
resolve_fused_ops: Flash Attention enabled
""".splitlines()  # noqa: E501 - the lines as llama.cpp writes them

# the same facts on a GPU, in the formats of llama.cpp's sources (llama.cpp, llama-model.cpp,
# llama-kv-cache.cpp, llama-context.cpp of the vendored version)
CUDA_LOG = """\
llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H200) (0000:1a:00.0) - 140084 MiB free
load_tensors: offloaded 19/19 layers to GPU
load_tensors:        CUDA0 model buffer size =   235.16 MiB
load_tensors:   CPU_Mapped model buffer size =   100.00 MiB
llama_kv_cache:      CUDA0 KV buffer size =    38.00 MiB
llama_kv_cache: size =   38.00 MiB (  8192 cells,  18 layers, 32/1 seqs), K (q8_0):   19.00 MiB, V (q8_0):   19.00 MiB
llama_init_from_model: enabling flash_attn since it is required for quantized V cache
""".splitlines()  # noqa: E501


def test_a_cpu_load_is_read_and_described():
    p = parse_log(CPU_LOG)
    assert p.devices == [] and p.layers_offloaded is None
    assert p.kv_mib == {"CPU": 72.0} and p.kv_types == ("f16", "f16") and p.flash_attn is True
    text = describe(p, "CPU", 2, 18)
    assert "CPU, 2 threads" in text and "all 18 layers on the CPU" in text
    assert "72 MiB of f16 cells (CPU 72 MiB)" in text and "flash attention: on" in text


def test_a_gpu_load_is_read_and_described():
    p = parse_log(CUDA_LOG)
    assert p.devices == [("CUDA0", "NVIDIA H200", 140084)]
    assert (p.layers_offloaded, p.layers_total) == (19, 19)
    assert p.kv_mib == {"CUDA0": 38.0} and p.kv_types == ("q8_0", "q8_0") and p.flash_attn
    text = describe(p, "CUDA", 16, 18)
    assert "CUDA on CUDA0 (NVIDIA H200, 140,084 MiB free)" in text
    assert "all 19 layers offloaded to the GPU" in text and "q8_0 cells (CUDA0 38 MiB)" in text


def test_flash_attention_as_asked_when_llama_cpp_says_nothing():
    assert parse_log([], "off").flash_attn is False
    assert parse_log([], "on").flash_attn is True
    assert parse_log(["Flash Attention not supported, set to disabled"]).flash_attn is False


def test_an_idle_nvidia_gpu_is_warned_about_with_the_fix(monkeypatch):
    monkeypatch.setattr(placement, "nvidia_gpu_visible", lambda: True)
    warning = gpu_without_offload(False)
    assert warning and "make setup GPU=cuda" in warning
    assert gpu_without_offload(True) is None
    monkeypatch.setattr(placement, "nvidia_gpu_visible", lambda: False)
    assert gpu_without_offload(False) is None


def test_layers_on_rpc_workers_are_said_to_be_there():
    p = parse_log(
        [
            "llama_model_load_from_file_impl: using device RPC0 (127.0.0.1:50061) (unknown id) - "
            "24105 MiB free",
            "load_tensors: offloaded 12/19 layers to GPU",
        ]
    )
    text = describe(p, "CPU", 2, 18)
    assert "12/19 layers offloaded to RPC workers, the rest on CPU" in text


def test_an_rpc_build_without_devices_keeps_its_layers_on_the_cpu():
    p = parse_log(["load_tensors: offloaded 19/19 layers to GPU"])  # what an RPC build logs
    assert "layers: all 18 layers on the CPU" in describe(p, "CPU", 2, 18)
