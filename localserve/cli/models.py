"""`localserve models`: the configured models, where their files are, what fits in the memory
there is (runners/footprint.py: estimated from each GGUF's header), the prefix cache's budgets
(runners/prefix_disk.py: in RAM and on disk, and what the disk holds now), and the llama.cpp
build.

Tested in tests/unit/cli/test_cli.py.
"""

from __future__ import annotations

import argparse
import sys

from localserve.cli.shared import gpu_warning
from localserve.config import DEFAULT_MODEL, config_path, load_config


def add(sub) -> None:
    m = sub.add_parser(
        "models",
        help="list configured models; assemble the embedded one",
        description="List the models of the configuration file (and say which file that is), "
        "assemble and verify the embedded model, and say which llama.cpp backend is built.",
    )
    m.set_defaults(run=cmd_models)


def cmd_models(args: argparse.Namespace) -> int:
    from localserve.ops.usage import state_dir
    from localserve.runners.models import resolve_model

    config = load_config(args.config)
    state = state_dir(config.server)
    print(_source_line(args.config))
    available, gpu = memory_there()
    print(
        f"memory: {available.free / GiB:.1f} GiB free in {available.where}, "
        f"{available.reserve / GiB:.1f} GiB kept back: {available.usable / GiB:.1f} GiB for models"
    )
    for name, model in config.models.items():
        mark = "*" if name == config.default else " "
        path = resolve_model(name, model)
        print(f"{mark} {name:20} {path}  n_ctx={model.n_ctx} max_num_seqs={model.max_num_seqs}")
        for line in fit_lines(path, model, available.usable, gpu):
            print(f"    {line}")
        print(f"    {cache_line(name, model, state)}")
    print(_build_line())
    warning = gpu_warning()
    if warning:
        print(warning, file=sys.stderr)
    return 0


GiB = 1 << 30


def memory_there():
    """(Available, gpu): a local GPU's free memory on a build that offloads, else the RAM."""
    from localserve.runners.footprint import device_available, host_available

    device = device_available()
    return (device, True) if device is not None else (host_available(), False)


def fit_lines(path, model, usable: int, gpu: bool) -> list[str]:
    """What the model needs at its settings, and the context and parallel sequences each KV
    cell type allows in `usable` bytes."""
    from localserve.runners.footprint import MIB, capacity, estimate, host_cache_bytes, shape
    from localserve.runners.gguf_header import read_header

    header = read_header(path)
    need = estimate(header, model, gpu, host_cache=host_cache_bytes(model))  # as the pool does
    where = f"{need.device / MIB:.0f} MiB on the GPU + {need.host / MIB:.0f} MiB RAM" if gpu else ""
    weights = (need.weights_device + need.weights_host) / MIB
    compute = (need.compute_device + need.compute_host) / MIB
    cells = f"{need.n_cells} {model.cache_type_k}/{model.cache_type_v} cells"
    lines = [
        f"needs ~{need.total / MIB:.0f} MiB {where}(weights {weights:.0f}, "
        f"KV {need.kv / MIB:.0f} for {cells}, compute {compute:.0f}, "
        f"prefix cache {need.cache_host / MIB:.0f})"
    ]
    share = max(1, model.n_ctx // model.max_num_seqs)
    kinds = dict.fromkeys([model.cache_type_k, "q8_0", "q4_0"])
    for kind in kinds:
        cells, seqs = capacity(header, model, usable, gpu, kind)
        trained = " (all it was trained for)" if cells == shape(header).context_length else ""
        lines.append(
            f"fits with {kind} cells: n_ctx up to {cells}{trained}, "
            f"or {seqs} parallel sequences of {share}"
        )
    return lines


def cache_line(name: str, model, state) -> str:
    """The prefix cache's budgets (in RAM, counted in the need above on a CPU; on disk under
    `state`) and what its disk tier holds there now."""
    from localserve.runners.footprint import MIB
    from localserve.runners.prefix_disk import cache_budgets
    from localserve.runners.prefix_files import disk_bytes

    host, disk = cache_budgets(model, state)

    def budget(nbytes: int, mib: int) -> str:
        return "off" if not nbytes else f"{nbytes / MIB:.0f} MiB" + (" (auto)" if mib < 0 else "")

    used = disk_bytes(state, name)
    held = f", {used / MIB:.1f} MiB saved in {state / 'kv-cache'}" if used else ""
    return (
        f"prefix cache: {budget(host, model.host_cache_mib)} in RAM, "
        f"{budget(disk, model.disk_cache_mib)} on disk{held}"
    )


def _source_line(path: str | None) -> str:
    """Which configuration file was read; a warning on stderr when none was found."""
    source = config_path(path)
    if source is not None:
        return f"configuration: {source.resolve()}"
    print(
        "localserve: no configuration file found (--config, $LOCALSERVE_MODELS, ./models.toml): "
        f"using the built-in defaults (the embedded {DEFAULT_MODEL})",
        file=sys.stderr,
    )
    return "configuration: built-in defaults (no models.toml)"


def _build_line() -> str:
    """Which llama.cpp is installed: what it can offload to (without loading a model)."""
    import llama_cpp

    from localserve.runners.rpc import has_local_gpu, supports_rpc

    system = llama_cpp.llama_print_system_info().decode(errors="replace")
    rpc = ", RPC backend" if supports_rpc() else ""
    if not has_local_gpu():
        return f"llama.cpp: CPU build (no GPU offload{rpc})"
    kind = "CUDA" if "CUDA" in system else "GPU"
    return f"llama.cpp: {kind} build (layers can be offloaded{rpc})"
