"""What runs where, read from llama.cpp's own log lines (placement.py)."""

from __future__ import annotations

from localserve.protocol.snapshot import Device
from localserve.runners import placement
from localserve.runners.placement import describe, gpu_without_offload, parse_log, split_devices

# the embedded model (Gemma 3 270M, 18 layers) loaded on the CPU: llama.cpp's debug lines name
# the device of each layer, the output layer (18) last
CPU_LOG = """\
load_tensors: layer   0 assigned to device CPU, is_swa = 1
load_tensors: layer   1 assigned to device CPU, is_swa = 1
load_tensors: layer   2 assigned to device CPU, is_swa = 1
load_tensors: layer   3 assigned to device CPU, is_swa = 1
load_tensors: layer   4 assigned to device CPU, is_swa = 1
load_tensors: layer   5 assigned to device CPU, is_swa = 0
load_tensors: layer   6 assigned to device CPU, is_swa = 1
load_tensors: layer   7 assigned to device CPU, is_swa = 1
load_tensors: layer   8 assigned to device CPU, is_swa = 1
load_tensors: layer   9 assigned to device CPU, is_swa = 1
load_tensors: layer  10 assigned to device CPU, is_swa = 1
load_tensors: layer  11 assigned to device CPU, is_swa = 0
load_tensors: layer  12 assigned to device CPU, is_swa = 1
load_tensors: layer  13 assigned to device CPU, is_swa = 1
load_tensors: layer  14 assigned to device CPU, is_swa = 1
load_tensors: layer  15 assigned to device CPU, is_swa = 1
load_tensors: layer  16 assigned to device CPU, is_swa = 1
load_tensors: layer  17 assigned to device CPU, is_swa = 0
load_tensors: layer  18 assigned to device CPU, is_swa = 0
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


# the same model split by a real load: n_gpu_layers = 12, tensor_split = [1, 1] over two
# `localserve worker`s on 127.0.0.1:50081 and :50082. The registry calls the workers' devices
# RPC0 and RPC1, the layer lines use those names, but a worker's buffers are named by the
# device's index on that worker: both workers' are "RPC0[host:port]".
SPLIT_LOG = """\
llama_prepare_model_devices: using device RPC0 (127.0.0.1:50081) (unknown id) - 24105 MiB free
llama_prepare_model_devices: using device RPC1 (127.0.0.1:50082) (unknown id) - 24105 MiB free
load_tensors: layer   0 assigned to device CPU, is_swa = 1
load_tensors: layer   1 assigned to device CPU, is_swa = 1
load_tensors: layer   2 assigned to device CPU, is_swa = 1
load_tensors: layer   3 assigned to device CPU, is_swa = 1
load_tensors: layer   4 assigned to device CPU, is_swa = 1
load_tensors: layer   5 assigned to device CPU, is_swa = 0
load_tensors: layer   6 assigned to device CPU, is_swa = 1
load_tensors: layer   7 assigned to device RPC0, is_swa = 1
load_tensors: layer   8 assigned to device RPC0, is_swa = 1
load_tensors: layer   9 assigned to device RPC0, is_swa = 1
load_tensors: layer  10 assigned to device RPC0, is_swa = 1
load_tensors: layer  11 assigned to device RPC0, is_swa = 0
load_tensors: layer  12 assigned to device RPC0, is_swa = 1
load_tensors: layer  13 assigned to device RPC1, is_swa = 1
load_tensors: layer  14 assigned to device RPC1, is_swa = 1
load_tensors: layer  15 assigned to device RPC1, is_swa = 1
load_tensors: layer  16 assigned to device RPC1, is_swa = 1
load_tensors: layer  17 assigned to device RPC1, is_swa = 0
load_tensors: layer  18 assigned to device RPC1, is_swa = 0
load_tensors: offloaded 12/19 layers to GPU
load_tensors:   CPU_Mapped model buffer size =   195.15 MiB
load_tensors: RPC0[127.0.0.1:50081] model buffer size =    21.34 MiB
load_tensors: RPC0[127.0.0.1:50082] model buffer size =   188.67 MiB
llama_context: flash_attn            = auto
llama_kv_cache:        CPU KV buffer size =     2.00 MiB
llama_kv_cache: RPC0[127.0.0.1:50081] KV buffer size =     2.00 MiB
llama_kv_cache: RPC0[127.0.0.1:50082] KV buffer size =     2.00 MiB
llama_kv_cache: size =    6.00 MiB (  2048 cells,   3 layers, 24/1 seqs), K (f16):    3.00 MiB, V (f16):    3.00 MiB
llama_kv_cache:        CPU KV buffer size =    12.00 MiB
llama_kv_cache: RPC0[127.0.0.1:50081] KV buffer size =    10.00 MiB
llama_kv_cache: RPC0[127.0.0.1:50082] KV buffer size =     8.00 MiB
llama_kv_cache: size =   30.00 MiB (  2048 cells,  15 layers, 24/1 seqs), K (f16):   15.00 MiB, V (f16):   15.00 MiB
resolve_fused_ops: Flash Attention enabled
""".splitlines()  # noqa: E501

SPLIT = (
    Device("CPU", "AMD EPYC", 7, 14.0),
    Device("RPC0", "127.0.0.1:50081", 6, 12.0, "127.0.0.1:50081"),
    Device("RPC1", "127.0.0.1:50082", 5, 10.0, "127.0.0.1:50082"),  # and the output layer
)


def test_a_split_over_two_workers_gives_each_device_its_layers_and_kv():
    p = parse_log(SPLIT_LOG)
    assert p.kv_mib == {"CPU": 14.0, "RPC0[127.0.0.1:50081]": 12.0, "RPC0[127.0.0.1:50082]": 10.0}
    devices = split_devices(p, {"CPU": "AMD EPYC", "RPC0": "127.0.0.1:50081"})
    assert devices == SPLIT
    assert sum(d.layers for d in devices) == 18 and sum(d.kv_mib for d in devices) == 36.0
    # without the registry's descriptions the CPU has none; the rest is in the log
    assert split_devices(p)[0] == Device("CPU", "", 7, 14.0)


def test_the_start_up_block_lists_each_device_of_a_split():
    text = describe(parse_log(SPLIT_LOG), "CPU", 2, 18, SPLIT)
    assert text.splitlines() == [
        "  device: CPU on RPC0 (127.0.0.1:50081, 24,105 MiB free), "
        "RPC1 (127.0.0.1:50082, 24,105 MiB free)",
        "  layers: 12/19 layers offloaded to RPC workers, the rest on CPU",
        "  KV cache: 36 MiB of f16 cells",  # per device below, by the devices' names
        "  flash attention: on",
        "  per device:",
        "    CPU                    7/18 layers   14 MiB KV   AMD EPYC",
        "    RPC0 127.0.0.1:50081   6/18 layers   12 MiB KV",
        "    RPC1 127.0.0.1:50082   5/18 layers   10 MiB KV",
    ]


def test_all_on_the_cpu_lists_no_devices_and_the_block_is_as_before():
    p = parse_log(CPU_LOG)
    assert len(p.layer_devices) == 19 and set(p.layer_devices.values()) == {"CPU"}
    assert split_devices(p, {"CPU": "AMD EPYC"}) == ()
    assert describe(p, "CPU", 2, 18, ()).splitlines() == [
        "  device: CPU, 2 threads",
        "  layers: all 18 layers on the CPU",
        "  KV cache: 72 MiB of f16 cells (CPU 72 MiB)",
        "  flash attention: on",
    ]


def test_no_layer_lines_no_devices():
    assert split_devices(parse_log(CUDA_LOG)) == ()  # nothing said about the layers


def test_a_partial_gpu_offload_lists_the_cpu_and_the_gpu():
    # llama.cpp's formats (llama-model.cpp, llama-kv-cache.cpp): 12 of 19 layers to CUDA0
    lines = [
        "llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H200) (0000:1a:00.0) - "
        "140084 MiB free",
        *(f"load_tensors: layer {il:3d} assigned to device CPU, is_swa = 1" for il in range(7)),
        *(
            f"load_tensors: layer {il:3d} assigned to device CUDA0, is_swa = 0"
            for il in range(7, 19)
        ),
        "llama_kv_cache:        CPU KV buffer size =    14.00 MiB",
        "llama_kv_cache:      CUDA0 KV buffer size =    22.00 MiB",
    ]
    devices = split_devices(parse_log(lines), {"CPU": "AMD EPYC", "CUDA0": "NVIDIA H200"})
    assert devices == (
        Device("CPU", "AMD EPYC", 7, 14.0),
        Device("CUDA0", "NVIDIA H200", 11, 22.0),
    )
    text = describe(parse_log(lines), "CUDA", 16, 18, devices)
    assert "    CUDA0   11/18 layers   22 MiB KV   NVIDIA H200" in text


def test_all_on_one_gpu_is_listed_without_the_cpu():
    lines = [
        *(f"load_tensors: layer {il:3d} assigned to device CUDA0, is_swa = 0" for il in range(19)),
        "llama_kv_cache:      CUDA0 KV buffer size =    38.00 MiB",
    ]
    assert split_devices(parse_log(lines)) == (Device("CUDA0", "", 18, 38.0),)


def test_a_worker_lending_two_devices_has_its_buffers_told_apart():
    # ggml-rpc.cpp: the second worker added lends two devices, registered as RPC1 and RPC2 and
    # described by its endpoint; their buffers are RPC0[endpoint] and RPC1[endpoint]
    lines = [
        "llama_prepare_model_devices: using device RPC0 (10.0.0.1:50052) (unknown id) - 1 MiB free",
        "llama_prepare_model_devices: using device RPC1 (10.0.0.2:50052) (unknown id) - 1 MiB free",
        "llama_prepare_model_devices: using device RPC2 (10.0.0.2:50052) (unknown id) - 1 MiB free",
        *(
            f"load_tensors: layer {il:3d} assigned to device RPC{min(il // 6, 2)}, is_swa = 0"
            for il in range(19)  # the output layer (18) with the last
        ),
        "llama_kv_cache: RPC0[10.0.0.1:50052] KV buffer size =    12.00 MiB",
        "llama_kv_cache: RPC0[10.0.0.2:50052] KV buffer size =    11.00 MiB",
        "llama_kv_cache: RPC1[10.0.0.2:50052] KV buffer size =    10.00 MiB",
    ]
    devices = split_devices(parse_log(lines))
    assert [(d.name, d.layers, d.kv_mib, d.endpoint) for d in devices] == [
        ("RPC0", 6, 12.0, "10.0.0.1:50052"),
        ("RPC1", 6, 11.0, "10.0.0.2:50052"),
        ("RPC2", 6, 10.0, "10.0.0.2:50052"),
    ]
