"""The disk tier's files (runners/prefix_files.py): one written is read back whole and checked;
a damaged, cut, misnamed or another identity's file is named for what it is; a model's
directory and identity."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localserve.config import ModelConfig
from localserve.engine.prefix_tiers import SavedPrefix, prefix_key
from localserve.runners.fake import FakeRunner
from localserve.runners.prefix_files import (
    MAGIC,
    UnsoundFile,
    disk_bytes,
    file_bytes,
    identity_digest,
    model_dir,
    model_identity,
    read_file,
    read_header,
    write_file,
)

IDENTITY = identity_digest({"model": "stand-in.gguf"})


def entry(owner: str | None = "alice", n: int = 300) -> SavedPrefix:
    tokens = list(range(100_000, 100_000 + n))  # 3 bytes each in msgpack
    return SavedPrefix(tokens, owner, 5000, data=os.urandom(5000))


def written(directory: Path, e: SavedPrefix) -> Path:
    path = directory / f"{e.key}.kv"
    assert write_file(path, IDENTITY, e) == path.stat().st_size <= file_bytes(e)
    return path


def test_a_file_is_read_back_whole_and_its_header_alone(tmp_path):
    e = entry()
    path = written(tmp_path, e)
    assert path.read_bytes().startswith(MAGIC) and path.stat().st_mode & 0o777 == 0o600
    header, data = read_file(path, IDENTITY)
    assert (header.owner, header.tokens, data) == ("alice", e.tokens, e.data)
    header, st = read_header(path, IDENTITY)
    assert header.data_bytes == 5000 and st.st_size == path.stat().st_size
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


@pytest.mark.parametrize(
    ("spoil", "why"),
    [
        (lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]), r"damaged \(checksum\)"),
        (lambda raw: raw[:-10], "cut short"),
        (lambda raw: raw + b"x", "too long"),
        (lambda raw: raw[:40], "its header is cut short"),
        (lambda raw: b"GGUF" + raw[4:], "not a saved prefix"),
    ],
)
def test_a_spoiled_file_is_named_for_what_is_wrong(tmp_path, spoil, why):
    path = written(tmp_path, entry())
    path.write_bytes(spoil(path.read_bytes()))
    with pytest.raises(UnsoundFile, match=why):
        read_file(path, IDENTITY)


def test_another_identity_s_or_a_misnamed_file_is_not_ours(tmp_path):
    e = entry()
    path = written(tmp_path, e)
    with pytest.raises(UnsoundFile, match="another model's or build's"):
        read_header(path, identity_digest({"model": "another.gguf"}))
    bobs = tmp_path / f"{prefix_key('bob', e.tokens)}.kv"  # alice's state under bob's name
    bobs.write_bytes(path.read_bytes())
    with pytest.raises(UnsoundFile, match="named for another prefix"):
        read_file(bobs, IDENTITY)
    with pytest.raises(UnsoundFile, match="not as long as its header says"):
        path.write_bytes(path.read_bytes()[:-1])
        read_header(path, IDENTITY)


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    def no_space(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(OSError, match="No space"):
        written(tmp_path, entry())
    assert list(tmp_path.iterdir()) == []


def test_two_model_names_never_share_a_directory(tmp_path):
    names = ["a/b", "a_b", "..", "qwen3:0.6b"]
    dirs = {model_dir(tmp_path, n) for n in names}
    assert len(dirs) == 4 and all(d.parent == tmp_path / "kv-cache" for d in dirs)
    assert model_dir(tmp_path, "gemma-3-270m").name == "gemma-3-270m"


def test_the_identity_names_the_file_the_build_and_the_context(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    cfg = ModelConfig(path=str(gguf), cache_type_k="q8_0")
    one = model_identity(gguf, cfg, FakeRunner(n_ctx=4096))
    assert one["n_ctx"] == 4096 and one["cache_type_k"] == "q8_0" and one["system"]
    assert one["model"]["size"] == 4 and one["swa_full"] and one["kv_unified"]
    same = model_identity(gguf, cfg, FakeRunner(n_ctx=4096))
    assert identity_digest(one) == identity_digest(same)
    bigger = model_identity(gguf, cfg, FakeRunner(n_ctx=8192))
    assert identity_digest(bigger) != identity_digest(one)


def test_disk_bytes_counts_a_model_s_files(tmp_path):
    assert disk_bytes(tmp_path, "m") == 0
    directory = model_dir(tmp_path, "m") / IDENTITY
    directory.mkdir(parents=True)
    path = written(directory, entry())
    assert disk_bytes(tmp_path, "m") == path.stat().st_size
