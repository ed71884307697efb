"""What runs where: the backend, its devices, the layers offloaded, the KV cache, flash attention.

llama.cpp has no API for most of it (how many layers landed on a GPU, how big the KV buffers are
and on which device, whether `flash_attn = "auto"` turned it on), but it logs each fact once
while it loads a model and creates a context. `LlamaRunner` hands those log lines here;
`parse_log` reads them into a `Placement` and `describe` writes the start-up block every command
prints. `split_devices` says how a model split across devices (a GPU, RPC workers) shares its
layers and KV cache out. `gpu_without_offload` is the check for the usual trap: an NVIDIA GPU in
the machine and a llama.cpp built without CUDA.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field

from localserve.protocol.snapshot import Device

_DEVICE = re.compile(r"using device (\S+) \((.*?)\) \(.*?\) - (\d+) MiB free")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_MODEL_BUFFER = re.compile(r"(\S+) model buffer size = +([\d.]+) MiB")
_KV_BUFFER = re.compile(r"(\S+) KV buffer size = +([\d.]+) MiB")
_COMPUTE_BUFFER = re.compile(r"(\S+) compute buffer size = +([\d.]+) MiB")
_OUTPUT_BUFFER = re.compile(r"(\S+) +output buffer size = +([\d.]+) MiB")
_KV_TYPES = re.compile(r"K \((\w+)\): .*V \((\w+)\)")
_FA_AUTO = re.compile(r"Flash Attention (enabled|not supported)|(enabling) flash_attn")
# a debug line per layer, the output layer last: "layer  12 assigned to device RPC0, is_swa = 1"
_LAYER = re.compile(r"layer +(\d+) assigned to device (\S+?),")
# an RPC worker's buffers: "RPC<its device index on that worker>[host:port]"
_RPC_BUFFER = re.compile(r"RPC(\d+)\[(.+)\]")

FIX_CUDA = "make setup GPU=cuda"


@dataclass
class Placement:
    devices: list[tuple[str, str, int]] = field(default_factory=list)  # name, description, MiB
    layers_offloaded: int | None = None  # None: llama.cpp offloaded nothing (no GPU backend)
    layers_total: int | None = None  # offloadable layers (the output layer included)
    model_mib: dict[str, float] = field(default_factory=dict)  # by buffer (CPU_Mapped, CUDA0)
    kv_mib: dict[str, float] = field(default_factory=dict)  # by device buffer (CPU, CUDA0)
    kv_types: tuple[str, str] = ("f16", "f16")
    compute_mib: dict[str, float] = field(default_factory=dict)  # the graph's, by device buffer
    output_mib: dict[str, float] = field(default_factory=dict)  # logits rows, by buffer
    flash_attn: bool | None = None  # None: not said (flash_attn = "on" or "off" as asked)
    layer_devices: dict[int, str] = field(default_factory=dict)  # layer -> device (CPU, RPC1)

    @property
    def kv_total_mib(self) -> float:
        return sum(self.kv_mib.values())


def parse_log(lines: list[str], flash_attn: str = "auto") -> Placement:
    """The facts in llama.cpp's log lines from one model load and context creation."""
    p = Placement()
    for line in lines:
        if m := _DEVICE.search(line):
            p.devices.append((m[1], m[2], int(m[3])))
        elif m := _LAYER.search(line):
            p.layer_devices[int(m[1])] = m[2]
        elif m := _OFFLOADED.search(line):
            p.layers_offloaded, p.layers_total = int(m[1]), int(m[2])
        elif m := _MODEL_BUFFER.search(line):
            p.model_mib[m[1]] = p.model_mib.get(m[1], 0.0) + float(m[2])
        elif m := _KV_BUFFER.search(line):
            p.kv_mib[m[1]] = p.kv_mib.get(m[1], 0.0) + float(m[2])
        elif m := _COMPUTE_BUFFER.search(line):
            p.compute_mib[m[1]] = p.compute_mib.get(m[1], 0.0) + float(m[2])
        elif m := _OUTPUT_BUFFER.search(line):
            p.output_mib[m[1]] = p.output_mib.get(m[1], 0.0) + float(m[2])
        elif m := _KV_TYPES.search(line):
            p.kv_types = (m[1], m[2])
        elif m := _FA_AUTO.search(line):
            p.flash_attn = m[1] == "enabled" or m[2] == "enabling"
    if p.flash_attn is None and flash_attn != "auto":
        p.flash_attn = flash_attn == "on"
    return p


def split_devices(p: Placement, descriptions: dict[str, str] | None = None) -> tuple[Device, ...]:
    """Each device holding layers or KV cells, in layer order, with its repeating layers (the
    output layer, logged last, not counted) and its KV MiB; empty when everything is on the CPU
    (or llama.cpp logged no layer assignments). `descriptions` (device name -> description, as
    `rpc.devices()` has them) fills in what the log does not say, the CPU's name for one."""
    if not p.layer_devices:
        return ()
    known = {name: desc for name, desc, _ in p.devices}
    for name, desc in (descriptions or {}).items():
        known.setdefault(name, desc)
    output = max(p.layer_devices)
    layers: dict[str, int] = {}
    for il in sorted(p.layer_devices):
        name = p.layer_devices[il]
        layers[name] = layers.get(name, 0) + (il != output)
    kv: dict[str, float] = {}
    endpoints: dict[str, str] = {}
    for buffer, mib in p.kv_mib.items():
        name, endpoint = _buffer_device(buffer, known, layers)
        kv[name] = kv.get(name, 0.0) + mib
        if endpoint:
            endpoints[name] = endpoint
    names = list(layers) + [name for name in kv if name not in layers]
    if names == ["CPU"]:
        return ()
    return tuple(
        Device(
            name=name,
            description=known.get(name, ""),
            layers=layers.get(name, 0),
            kv_mib=kv.get(name, 0.0),
            endpoint=endpoints.get(name) or (known.get(name, "") if _is_rpc(name) else ""),
        )
        for name in names
    )


def _is_rpc(name: str) -> bool:
    return name.startswith("RPC") and name[3:].isdigit()


def _buffer_device(buffer: str, known: dict[str, str], layers: dict[str, int]) -> tuple[str, str]:
    """The device a KV buffer lives on, and its endpoint for an RPC worker's. Buffers are named
    by device (CPU, CUDA0) except RPC ones: "RPC0[host:port]" is the first device of the worker
    at host:port, which the registry calls RPC0, RPC1, ... by the order workers were added (and
    describes by its endpoint)."""
    if buffer in known or buffer in layers:
        return buffer, ""
    m = _RPC_BUFFER.fullmatch(buffer)
    if not m:
        return buffer, ""
    index, endpoint = int(m[1]), m[2]
    on_worker = sorted(
        (name for name, desc in known.items() if _is_rpc(name) and desc == endpoint),
        key=lambda name: int(name[3:]),
    )
    return (on_worker[index] if index < len(on_worker) else buffer), endpoint


def describe(
    p: Placement, backend: str, n_threads: int, n_layer: int, devices: tuple[Device, ...] = ()
) -> str:
    """The start-up block: a few lines a person reads once; with `devices` (a split model), a
    line for each with its layers and KV cache."""
    if p.devices:
        gpus = ", ".join(f"{name} ({desc}, {mib:,} MiB free)" for name, desc, mib in p.devices)
        device = f"{backend} on {gpus}"
    else:
        device = f"{backend}, {n_threads} threads"
    # an RPC build logs "offloaded 19/19 layers to GPU" with no device to put them on: without
    # a device the layers are where they always were
    if p.layers_offloaded is None or not p.devices:
        layers = f"all {n_layer} layers on the CPU"
    else:
        names = [name for name, _, _ in p.devices]
        remote = names and all(name.startswith("RPC") for name in names)
        off = "to RPC workers" if remote else "to the GPU"  # llama.cpp's log says "to GPU"
        layers = f"{p.layers_offloaded}/{p.layers_total} layers offloaded {off}, the rest on CPU"
        if p.layers_offloaded == p.layers_total:
            layers = f"all {p.layers_total} layers offloaded {off}"
    where = ", ".join(f"{dev} {mib:,.0f} MiB" for dev, mib in p.kv_mib.items()) or "?"
    k, v = p.kv_types
    cells = k if k == v else f"K {k}, V {v}"
    kv = f"{p.kv_total_mib:,.0f} MiB of {cells} cells"
    fa = {True: "on", False: "off", None: "?"}[p.flash_attn]
    return "\n".join(
        [
            f"  device: {device}",
            f"  layers: {layers}",
            f"  KV cache: {kv}" if devices else f"  KV cache: {kv} ({where})",
            f"  flash attention: {fa}",
            *_device_lines(devices, n_layer),
        ]
    )


def _device_lines(devices: tuple[Device, ...], n_layer: int) -> list[str]:
    """A table under "per device:": name (and endpoint), layers, KV, description."""
    if not devices:
        return []
    labels = [d.label for d in devices]
    shares = [f"{d.layers}/{n_layer} layers" for d in devices]
    kvs = [f"{d.kv_mib:,.0f} MiB KV" for d in devices]
    wide = [max(len(x) for x in column) for column in (labels, shares, kvs)]
    lines = ["  per device:"]
    for d, label, share, kv in zip(devices, labels, shares, kvs, strict=True):
        desc = d.description if d.description not in ("", d.endpoint) else ""
        line = f"    {label:<{wide[0]}}   {share:>{wide[1]}}   {kv:>{wide[2]}}   {desc}"
        lines.append(line.rstrip())
    return lines


def nvidia_gpu_visible() -> bool:
    """An NVIDIA driver or tool on this machine (not proof that CUDA works, only a hint)."""
    return os.path.isdir("/proc/driver/nvidia/gpus") or shutil.which("nvidia-smi") is not None


def gpu_without_offload(supports_gpu_offload: bool) -> str | None:
    """A loud warning when an NVIDIA GPU is here but llama.cpp was built without GPU offload."""
    if supports_gpu_offload or not nvidia_gpu_visible():
        return None
    return (
        "WARNING: this machine has an NVIDIA GPU, but the installed llama.cpp was built without "
        f"GPU offload: everything runs on the CPU. Rebuild it with `{FIX_CUDA}`."
    )
