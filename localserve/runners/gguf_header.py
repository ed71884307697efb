"""A GGUF file's metadata and tensor table, read without loading the model.

gguf-py (the `gguf` package, llama.cpp's own) defines the format: its value types, tensor types
and their block sizes are used here. Its `GGUFReader` is not: it builds a numpy view for every
element of every array, and a 262,144-token vocabulary (three such arrays) took it 15-38 s on
the 2-core machine here, for a header that is 6.5 MB. This reader walks the same layout with
`struct`, keeps scalars and short arrays, and only counts long arrays (the vocabulary), so the
embedded model's header reads in well under a second. It reads from any byte prefix: the hub's
first few MiB of a file are enough (`localserve pull` sizes a model before fetching it).

Tested in tests/unit/runners/test_footprint.py.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

MAGIC = b"GGUF"
MAX_KEPT_ARRAY = 1024  # longer arrays (token lists, scores) are kept as their length only
ALIGNMENT_KEY = "general.alignment"

_SCALARS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


class TruncatedHeader(ValueError):
    """The bytes given end inside the header: read more of the file and try again."""


@dataclass(frozen=True)
class ArrayLength:
    """A long metadata array, kept as how many items it has."""

    length: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str  # "Q4_K", "F32", ...
    n_elements: int
    n_bytes: int


@dataclass
class GgufHeader:
    metadata: dict[str, object] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)
    data_offset: int = 0  # where tensor data begins (the header's size)

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    @property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise TruncatedHeader(f"the header goes on past byte {len(self.data)}")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.data):
            raise TruncatedHeader(f"the header goes on past byte {len(self.data)}")
        text = self.data[self.pos : self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, kind: int, depth: int = 0):
        kind = GGUFValueType(kind)
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            if depth >= 4:  # llama.cpp writes no arrays of arrays: a hostile file's recursion
                raise ValueError("GGUF: arrays nested too deep")
            item, n = GGUFValueType(self.take("<I")), self.take("<Q")
            if n > MAX_KEPT_ARRAY:
                self._skip(item, n)
                return ArrayLength(n)
            return [self.value(item, depth + 1) for _ in range(n)]
        return self.take(_SCALARS[kind])

    def _skip(self, item: GGUFValueType, n: int) -> None:
        if item == GGUFValueType.STRING:
            for _ in range(n):
                if self.pos + 8 > len(self.data):
                    raise TruncatedHeader(f"the header goes on past byte {len(self.data)}")
                self.pos += 8 + struct.unpack_from("<Q", self.data, self.pos)[0]
            if self.pos > len(self.data):
                raise TruncatedHeader(f"the header goes on past byte {len(self.data)}")
        elif item == GGUFValueType.ARRAY:
            raise ValueError("GGUF: a long array of arrays (not written by llama.cpp)")
        else:
            self.pos += n * struct.calcsize(_SCALARS[item])
            if self.pos > len(self.data):
                raise TruncatedHeader(f"the header goes on past byte {len(self.data)}")


def parse_header(data: bytes) -> GgufHeader:
    """The header in `data` (the file's first bytes); TruncatedHeader when it needs more."""
    if data[:4] != MAGIC:
        raise ValueError(f"not a GGUF file (starts with {data[:4]!r})")
    c = _Cursor(data)
    c.pos = 4
    version = c.take("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not one this reader knows (2, 3)")
    n_tensors, n_kv = c.take("<Q"), c.take("<Q")
    header = GgufHeader()
    for _ in range(n_kv):
        key = c.string()
        header.metadata[key] = c.value(c.take("<I"))
    for _ in range(n_tensors):
        name = c.string()
        dims = [c.take("<Q") for _ in range(c.take("<I"))]
        kind = GGMLQuantizationType(c.take("<I"))
        c.take("<Q")  # offset within the data section
        n = 1
        for d in dims:
            n *= d
        block, size = GGML_QUANT_SIZES[kind]
        header.tensors.append(TensorInfo(name, kind.name, n, n // block * size))
    align = int(header.metadata.get(ALIGNMENT_KEY, 32))
    header.data_offset = -(-c.pos // align) * align
    return header


def read_header(path: Path, max_bytes: int = 256 << 20) -> GgufHeader:
    """A GGUF file's header, reading only as much of it as the header takes."""
    size = 1 << 20
    with Path(path).open("rb") as f:
        while True:
            f.seek(0)
            data = f.read(size)
            try:
                return parse_header(data)
            except TruncatedHeader:
                if len(data) < size or size >= max_bytes:
                    raise ValueError(f"{path}: the GGUF header is cut short") from None
                size *= 4
