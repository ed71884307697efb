"""The disk tier's files: where a model's saved prefixes are, what their states depend on, and
one file's format, written atomically and read back checked (runners/prefix_disk.py keeps them).

    <state_dir>/kv-cache/<model>/<identity>/<key>.kv      directories 0700, files 0600

`identity` is a digest of everything a saved state depends on (`model_identity`: the GGUF file,
the llama.cpp build, the KV cell types, the context's real size and layout); `key` is
prefix_tiers.prefix_key(owner, tokens).

A file: the magic line, the header's length (4 bytes, little-endian), the header (msgpack:
`FileHeader`, whose checksum is a blake2b of its other fields and the data), then the state. It
is written to a temporary file in the same directory (`.<key>.<pid>.tmp`) and renamed over its
name: a killed writer leaves a temporary file, never a torn entry.

Tested in tests/unit/runners/test_prefix_files.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import BinaryIO

import msgspec

from localserve.config import ModelConfig
from localserve.engine.prefix_tiers import SavedPrefix, prefix_key
from localserve.engine.runner import Runner

MAGIC = b"localserve saved prefix 1\n"
SUFFIX = ".kv"
TEMP_SUFFIX = ".tmp"
MAX_HEADER_BYTES = 16 << 20  # a longer header is not one of ours


class FileHeader(msgspec.Struct):
    """What a file says of the state after it."""

    identity: str
    owner: str | None
    tokens: list[int]
    data_bytes: int
    checksum: str = ""  # blake2b of the other fields (encoded with checksum "") and the data


class UnsoundFile(ValueError):
    """A file that is not a sound entry of this identity and key (why: the message)."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(FileHeader)


def write_file(path: Path, identity: str, entry: SavedPrefix) -> int:
    """The entry's file at `path`, written to a temporary name and renamed; returns its size.
    OSError when it cannot be written (the temporary file removed)."""
    data = entry.data or b""
    header = FileHeader(identity, entry.owner, list(entry.tokens), len(data))
    header.checksum = _checksum(header, data)
    head = _encoder.encode(header)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}{TEMP_SUFFIX}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + len(head).to_bytes(4, "little") + head)
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    return len(MAGIC) + 4 + len(head) + len(data)


def file_bytes(entry: SavedPrefix) -> int:
    """At most what an entry's file takes (a token is at most 5 bytes of msgpack)."""
    owner = len((entry.owner or "").encode())
    return len(MAGIC) + 4 + 256 + owner + 5 * len(entry.tokens) + len(entry.data or b"")


def read_header(path: Path, identity: str) -> tuple[FileHeader, os.stat_result]:
    """A file's header alone, and its stat; UnsoundFile when it is unreadable, another
    identity's, named for another key, or not as long as its header says; OSError."""
    with path.open("rb") as f:
        header, offset = _header(f)
        st = os.fstat(f.fileno())
    _check(path, header, identity)
    if offset + header.data_bytes != st.st_size:
        raise UnsoundFile("not as long as its header says")
    return header, st


def read_file(path: Path, identity: str) -> tuple[FileHeader, bytes]:
    """A file read whole and checked: UnsoundFile saying what is wrong; OSError."""
    with path.open("rb") as f:
        header, offset = _header(f)
        if offset + header.data_bytes > os.fstat(f.fileno()).st_size:
            raise UnsoundFile("cut short")  # (never allocate what a damaged header claims)
        data = f.read(header.data_bytes + 1)  # one more: a file longer than it says
    _check(path, header, identity)
    if len(data) != header.data_bytes:
        raise UnsoundFile("cut short" if len(data) < header.data_bytes else "too long")
    if _checksum(header, data) != header.checksum:
        raise UnsoundFile("damaged (checksum)")
    return header, data


def _header(f: BinaryIO) -> tuple[FileHeader, int]:
    """The header of an open file and the offset of its data."""
    if f.read(len(MAGIC)) != MAGIC:
        raise UnsoundFile("not a saved prefix")
    length = int.from_bytes(f.read(4), "little")
    if not 0 < length <= MAX_HEADER_BYTES:
        raise UnsoundFile(f"a header of {length} bytes")
    raw = f.read(length)
    if len(raw) != length:
        raise UnsoundFile("its header is cut short")
    try:
        return _decoder.decode(raw), len(MAGIC) + 4 + length
    except msgspec.DecodeError as e:
        raise UnsoundFile(f"its header is unreadable ({e})") from None


def _check(path: Path, header: FileHeader, identity: str) -> None:
    if header.identity != identity:
        raise UnsoundFile("another model's or build's")
    if path.stem != prefix_key(header.owner, header.tokens):
        raise UnsoundFile("named for another prefix")


def _checksum(header: FileHeader, data: bytes) -> str:
    h = hashlib.blake2b(digest_size=32)
    h.update(_encoder.encode(msgspec.structs.replace(header, checksum="")))
    h.update(data)
    return h.hexdigest()


# --- where, and for what ---------------------------------------------------------------------


def identity_digest(identity: dict) -> str:
    """The digest of an identity: blake2b of its canonical JSON."""
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def model_identity(path: Path, cfg: ModelConfig, runner: Runner) -> dict:
    """Everything a model's saved states depend on: the GGUF file, the llama.cpp build, the KV
    cell types, the context's real size and layout (runners/llama.py's settings)."""
    import llama_cpp  # loaded already where a runner is

    real = path.resolve()
    st = real.stat()
    return {
        "model": {"path": str(real), "size": st.st_size, "mtime_ns": st.st_mtime_ns},
        "llama_cpp": llama_cpp.__version__,
        "system": llama_cpp.llama_print_system_info().decode(errors="replace"),
        "cache_type_k": cfg.cache_type_k,
        "cache_type_v": cfg.cache_type_v,
        "n_ctx": runner.info.n_ctx,
        "n_seq_max": runner.info.n_seq_max,
        "flash_attn": cfg.flash_attn,
        "swa_full": True,
        "kv_unified": True,
    }


def model_dir(state: Path, model: str) -> Path:
    """A model's directory of saved prefixes: its name made a safe file name (with a digest of
    the name when that changed it, so two names never share one)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model).lstrip(".")
    if safe != model:
        safe = f"{safe}-{hashlib.blake2b(model.encode(), digest_size=4).hexdigest()}"
    return state / "kv-cache" / safe


def disk_bytes(state: Path, model: str) -> int:
    """What a model's saved prefixes take on disk under `state` now (`localserve models`)."""
    total = 0
    for path in model_dir(state, model).glob("*/*" + SUFFIX):
        with contextlib.suppress(OSError):
            total += path.stat().st_size
    return total
