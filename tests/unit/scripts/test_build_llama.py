"""scripts/build_llama.py: the backend chosen, and a build never taken for the other backend."""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import ROOT

SCRIPT = ROOT / "scripts" / "build_llama.py"


@pytest.fixture(scope="module")
def build_llama():
    spec = importlib.util.spec_from_file_location("build_llama", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wheel(tmp_path: Path, *libs: str) -> Path:
    path = tmp_path / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        for lib in ("libllama.so", "libggml-cpu.so", "libggml-rpc.so", *libs):
            z.writestr(f"llama_cpp/lib/{lib}", b"")
    return path


def test_a_cpu_build_is_never_taken_for_cuda_nor_the_reverse(build_llama, tmp_path):
    cpu = wheel(tmp_path)
    assert build_llama.fits(cpu, "cpu") and not build_llama.fits(cpu, "cuda")
    (tmp_path / "cuda").mkdir()
    cuda = wheel(tmp_path / "cuda", "libggml-cuda.so")
    assert build_llama.fits(cuda, "cuda") and not build_llama.fits(cuda, "cpu")


def test_a_build_without_the_rpc_backend_is_never_taken(build_llama):
    names = ["llama_cpp/lib/libllama.so", "llama_cpp/lib/libggml-cpu.so"]
    assert not build_llama.fits_names(names, "cpu")
    assert build_llama.fits_names([*names, "llama_cpp/lib/libggml-rpc.so"], "cpu")


def test_cuda_needs_a_toolchain_and_a_driver(build_llama, monkeypatch, tmp_path):
    tools = {"nvcc": "/usr/bin/nvcc"}
    monkeypatch.setattr(build_llama.shutil, "which", tools.get)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setattr(build_llama, "Path", lambda p: tmp_path / "no-driver")
    assert build_llama.detect() == "cpu"  # a toolchain alone (this CI machine has one)
    tools["nvidia-smi"] = "/usr/bin/nvidia-smi"
    assert build_llama.detect() == "cuda"
    del tools["nvcc"]
    assert build_llama.detect() == "cpu"
