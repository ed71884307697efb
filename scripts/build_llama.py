"""Install the llama-cpp-python build this machine can use, never a stale one (stdlib only).

pip caches the wheel it builds from the llama-cpp-python source package under the package's
name, not its build flags: once a CPU build is cached, setting CMAKE_ARGS for CUDA later quietly
installs the CPU build again (and the reverse). So builds are kept here, one directory per
backend (~/.cache/localserve/wheels/cpu, .../cuda), and every wheel is checked before use: a
CUDA build carries libggml-cuda, a CPU build does not, and both carry libggml-rpc (llama.cpp's
RPC backend: a model split across machines, `localserve worker`). A wheel from pip's cache is
taken only when it passes that check; otherwise llama.cpp is compiled afresh with
--no-cache-dir. An installed build that fails it is replaced.

    python scripts/build_llama.py --python .venv/bin/python [--backend auto|cpu|cuda]

`auto` is `cuda` when an NVIDIA toolchain is present (nvcc on PATH, or CUDA_HOME set) and an
NVIDIA driver too: a CUDA build needs the driver's libcuda to load at all, so a machine with the
toolchain but no GPU (CI machines often are) gets the CPU build unless told `--backend cuda`.
Extra flags in $CMAKE_ARGS are passed to the build after the backend's own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGE = "llama-cpp-python==0.3.36"
WHEEL_GLOB = "llama_cpp_python-0.3.36-*.whl"
FLAGS = {
    "cpu": ["-DLLAVA_BUILD=OFF", "-DGGML_RPC=on"],
    "cuda": ["-DLLAVA_BUILD=OFF", "-DGGML_RPC=on", "-DGGML_CUDA=on"],
}
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "localserve" / "wheels"


def detect() -> str:
    toolchain = shutil.which("nvcc") or os.environ.get("CUDA_HOME")
    driver = Path("/proc/driver/nvidia/gpus").is_dir() or shutil.which("nvidia-smi")
    if toolchain and not driver:
        print(
            "build_llama: nvcc found but no NVIDIA driver: building for the CPU "
            "(GPU=cuda forces a CUDA build)",
            flush=True,
        )
    return "cuda" if toolchain and driver else "cpu"


def has_cuda(names: list[str]) -> bool:
    return any("libggml-cuda" in Path(name).name for name in names)


def has_rpc(names: list[str]) -> bool:
    return any("libggml-rpc" in Path(name).name for name in names)


def fits_names(names: list[str], backend: str) -> bool:
    return has_cuda(names) == (backend == "cuda") and has_rpc(names)


def fits(wheel: Path, backend: str) -> bool:
    with zipfile.ZipFile(wheel) as z:
        return fits_names(z.namelist(), backend)


def build(python: str, backend: str, out: Path, use_pip_cache: bool) -> Path | None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(WHEEL_GLOB):
        old.unlink()
    flags = " ".join(FLAGS[backend] + os.environ.get("CMAKE_ARGS", "").split())
    how = "" if use_pip_cache else ", compiling: about 12 minutes on 2 cores (CUDA: longer)"
    print(f"build_llama: llama.cpp for {backend} ({flags}){how}", flush=True)
    cmd = [python, "-m", "pip", "wheel", "--no-deps", "--progress-bar", "off", "-w", str(out)]
    if not use_pip_cache:
        cmd.append("--no-cache-dir")
    subprocess.run([*cmd, PACKAGE], check=True, env=os.environ | {"CMAKE_ARGS": flags})
    wheels = sorted(out.glob(WHEEL_GLOB))
    return wheels[-1] if wheels and fits(wheels[-1], backend) else None


def installed_libraries(python: str) -> list[str]:
    """The libraries of the llama-cpp-python in that environment ([]: not installed)."""
    code = (
        "import importlib.util, pathlib; s = importlib.util.find_spec('llama_cpp'); "
        "print('' if s is None else ' '.join(p.name for p in "
        "(pathlib.Path(s.origin).parent / 'lib').glob('*')))"
    )
    return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.split()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", required=True, help="the environment's interpreter")
    parser.add_argument("--backend", choices=["auto", "cpu", "cuda"], default="auto")
    args = parser.parse_args()
    backend = detect() if args.backend == "auto" else args.backend
    out = CACHE / backend
    wheels = sorted(out.glob(WHEEL_GLOB))
    wheel = wheels[-1] if wheels and fits(wheels[-1], backend) else None
    if wheel is None:
        wheel = build(args.python, backend, out, use_pip_cache=True)
    if wheel is None:  # pip's cache held a build for the other backend
        wheel = build(args.python, backend, out, use_pip_cache=False)
    if wheel is None:
        print(f"build_llama: the {backend} build has the wrong libraries", file=sys.stderr)
        return 1
    if not fits_names(installed_libraries(args.python), backend):
        subprocess.run(
            [
                args.python,
                "-m",
                "pip",
                "install",
                "--force-reinstall",
                "--no-deps",
                "--progress-bar",
                "off",
                str(wheel),
            ],
            check=True,
        )
    print(f"build_llama: llama-cpp-python for {backend}: {wheel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
