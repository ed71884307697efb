"""A GGUF of the same shapes as a given one, with random weights, for speed and memory tests.

The embedded model (240 MB) cannot travel to a machine that has nothing but what is carried
there; its metadata and tokenizer (a few MB) and this script can. Speed and memory depend on the
tensors' shapes and types, not their values, so a model with the same architecture, vocabulary,
shapes and metadata measures the same — but its text is noise. Weights are written as Q8_0
(what gguf-py can quantize), 1-D tensors (norms) as F32: the file is a little larger than a
Q4_K_M one and its matrix products a little slower; say so beside any figure.

    python scripts/random_gguf.py SOURCE.gguf OUT.gguf [--gguf-py DIR] [--seed 0]
    python scripts/random_gguf.py --metadata-only SOURCE.gguf META.gguf   # shapes, no weights

`--metadata-only` writes the source's metadata with the tensors' names and shapes in one more
key and no tensors at all (a few MB): carry that, then run this script on it at the other end
to make the full-size random model.
gguf-py is llama.cpp's (its `gguf-py` directory): pass it with --gguf-py when not installed.
"""

from __future__ import annotations

import argparse
import json
import sys
import types

import numpy as np

SHAPES_KEY = "localserve.tensor_shapes"  # in a shapes-only file: [[name, [numpy shape]], ...]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source")
    parser.add_argument("out")
    parser.add_argument("--gguf-py", help="llama.cpp's gguf-py directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--metadata-only", action="store_true")
    args = parser.parse_args()
    if args.gguf_py:
        sys.path.insert(0, args.gguf_py)
    try:
        import yaml  # noqa: F401 - gguf-py imports it for model cards, which are not read here
    except ImportError:
        sys.modules["yaml"] = types.ModuleType("yaml")  # nothing to carry for what is unused
    import gguf

    reader = gguf.GGUFReader(args.source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(args.out, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", SHAPES_KEY):
            continue
        if not field.types:
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
    shapes = _shapes(reader)
    if args.metadata_only:
        writer.add_key_value(SHAPES_KEY, json.dumps(shapes), gguf.GGUFValueType.STRING)
    else:
        writer.add_key_value("localserve.random_weights", True, gguf.GGUFValueType.BOOL)
        rng = np.random.default_rng(args.seed)
        for name, shape in shapes:  # numpy order: the last axis is ggml's ne0
            data = rng.normal(0.0, 0.02, size=shape).astype(np.float32)
            if len(shape) == 1:
                writer.add_tensor(name, data)
            else:
                q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
                writer.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    total = sum(int(np.prod(s)) for _, s in shapes)
    print(
        f"random_gguf: {args.out}: {len(shapes)} tensors, {total / 1e6:.0f}M weights"
        + (" (shapes only)" if args.metadata_only else "")
    )
    return 0


def _shapes(reader) -> list[tuple[str, list[int]]]:
    """Each tensor's shape in numpy order; a shapes-only file keeps them in a metadata key."""
    if SHAPES_KEY in reader.fields:
        return [
            (name, list(shape)) for name, shape in json.loads(reader.fields[SHAPES_KEY].contents())
        ]
    return [(t.name, [int(d) for d in reversed(t.shape)]) for t in reader.tensors]


if __name__ == "__main__":
    sys.exit(main())
