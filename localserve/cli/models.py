"""`localserve models`: the configured models, where their files are, and the llama.cpp build.

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
    from localserve.runners.models import resolve_model

    config = load_config(args.config)
    print(_source_line(args.config))
    for name, model in config.models.items():
        mark = "*" if name == config.default else " "
        path = resolve_model(name, model)
        print(f"{mark} {name:20} {path}  n_ctx={model.n_ctx} max_num_seqs={model.max_num_seqs}")
    print(_build_line())
    warning = gpu_warning()
    if warning:
        print(warning, file=sys.stderr)
    return 0


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
