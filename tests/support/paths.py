"""Where the checkout is, for tests that read its files or run its code in a subprocess."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: tests/support/paths.py


def templated_gguf(template: Path) -> Path:
    """The embedded GGUF with `template` as its chat template: written once (a 240 MB rewrite,
    ~10 s) into ~/.cache/localserve/tests and kept, keyed by the model file's name and size
    (the embedded model is verified by its checksum) and the template's contents; a
    half-written copy is never seen (written aside, then renamed)."""
    import hashlib
    import os
    import subprocess
    import sys

    from localserve.runners.models import cache_dir, ensure_embedded

    model = ensure_embedded()
    key = hashlib.sha256(model.name.encode() + str(model.stat().st_size).encode())
    key.update(template.read_bytes())
    out = cache_dir() / "tests" / f"{model.stem}-{key.hexdigest()[:16]}.gguf"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    aside = out.with_suffix(f".{os.getpid()}.part")
    write = [sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(model), str(aside)]
    write += ["--chat-template-file", str(template), "--force"]
    subprocess.run(write, check=True, capture_output=True, timeout=300)
    aside.replace(out)
    return out
