"""`localserve pull ORG/REPO[:QUANT]` (or ORG/REPO/FILE.gguf, or the Hub address of either pasted
from a browser: runners/hub.py's from_url): fetch a GGUF from the Hugging Face Hub and add a
models.toml entry for it.

Without a quantization it takes the best of the usual ones (runners/hub.py: Q4_K_M first, then
smaller) whose estimated footprint (runners/footprint.py, from the file's header read with a
Range request, weights by the file's size) fits the memory there is at a context of at least
MIN_CONTEXT, and says which and why. The entry uses the file's own chat template
(chat_format "template", no chat_template key) and the largest n_ctx up to DEFAULT_CONTEXT that
fits. An existing entry of the same name is never replaced: pass --name.

Tested in tests/e2e/test_pull.py.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from pathlib import Path

from localserve.config import ConfigError, ModelConfig, config_path, parse_config

MIN_CONTEXT = 2048
DEFAULT_CONTEXT = 8192  # as a models.toml entry's default n_ctx
MIB = 1 << 20


def add(sub) -> None:
    p = sub.add_parser(
        "pull",
        help="fetch a GGUF from the Hugging Face Hub and add it to models.toml",
        description="Fetch a GGUF from the Hugging Face Hub (HF_ENDPOINT, HF_HOME, HF_TOKEN "
        "honoured), check its sha256, and add a models.toml entry (--config's file, "
        "$LOCALSERVE_MODELS or ./models.toml) that uses its chat template, with an n_ctx that "
        "fits this machine.",
    )
    p.add_argument(
        "spec",
        help="ORG/REPO, ORG/REPO:QUANT (e.g. :Q4_K_M), ORG/REPO/FILE.gguf, or the Hub address "
        "of a repository or a file (https://huggingface.co/ORG/REPO/blob/main/FILE.gguf, "
        "hf.co/ORG/REPO:QUANT)",
    )
    p.add_argument("--name", help="the entry's name in models.toml (default: from the repo)")
    # what the server's /api/pull runs: its progress as JSON lines on stdout (serve/pulling.py)
    p.add_argument("--progress-json", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(run=cmd_pull)


def cmd_pull(args: argparse.Namespace) -> int:
    from localserve.runners import hub

    say = _progress_lines() if args.progress_json else None
    out = sys.stderr if say else sys.stdout  # the JSON lines have stdout to themselves
    if say:
        say({"status": "pulling manifest"})
    repo, quant, file = hub.parse_spec(args.spec)
    target = config_path(args.config) or Path("models.toml")
    existing = target.read_text(encoding="utf-8") if target.is_file() else ""
    candidates = hub.pick(hub.list_models(repo), quant, file, repo)
    usable, where, gpu = _usable()
    chosen, why = choose(repo, candidates, (usable, where, gpu), named=bool(quant or file))
    name = args.name or entry_name(repo, chosen.quant)
    _check_free(name, existing, target)
    print(f"pull: {chosen.name} ({chosen.size / MIB:.0f} MiB): {why}", file=sys.stderr)
    path = hub.download(repo, chosen, _file_progress(say) if say else None)
    if say:
        say({"status": "verifying sha256 digest"})  # done by download, file by file
        say({"status": "writing manifest"})
    n_ctx = fitting_context(path, chosen, usable, gpu)
    text = entry_text(name, path, n_ctx)
    parse_config(existing + text, str(target))  # the file stays valid, or nothing is written
    with target.open("a", encoding="utf-8") as entry:
        entry.write(text)
    print(f"added [models.{name}] to {target.resolve()}: {path} (n_ctx {n_ctx})", file=out)
    print(f"serve it: localserve serve --model {name}", file=out)
    if say:
        say({"status": "success", "name": name})
    return 0


def _progress_lines():
    """Print each progress object as a JSON line (Ollama's pull progress, as /api/pull sends)."""

    def say(event: dict) -> None:
        print(json.dumps(event), flush=True)

    return say


def _file_progress(say):
    """The download's progress as Ollama says it: the file's digest, total and completed."""
    last: dict[str, int] = {}

    def progress(f, completed: int) -> None:
        if last.get(f.name) == completed:
            return
        last[f.name] = completed
        digest = f"sha256:{f.sha256}" if f.sha256 else f.name
        say({"status": f"pulling {(f.sha256 or f.name)[:12]}", "digest": digest,
             "total": f.size, "completed": completed})  # fmt: skip

    return progress


def _usable() -> tuple[int, str, bool]:
    """(bytes usable, where: RAM or the GPU's name, whether that is a GPU)."""
    from localserve.cli.models import memory_there

    available, gpu = memory_there()
    return available.usable, available.where, gpu


def choose(repo: str, candidates, memory: tuple[int, str, bool], named: bool):
    """The first candidate whose footprint at MIN_CONTEXT fits (a named one even when it does
    not, with a warning), and a sentence saying why."""
    from localserve.runners import hub
    from localserve.runners.footprint import counted, estimate

    usable, where, gpu = memory
    header = hub.remote_header(repo, candidates[0].files[0].name)  # shapes: the same for all
    need = estimate(header, ModelConfig(path="-", n_ctx=MIN_CONTEXT), gpu)
    # KV and compute from the header; the weights by each candidate's size
    rest = counted(need, gpu) - need.weights_device - (0 if gpu else need.weights_host)
    room = f"{usable / MIB:.0f} MiB usable in {where}"
    for m in candidates:
        total = m.size + rest
        if total <= usable or named:
            if named:
                fits = "fits" if total <= usable else "does NOT fit: it may not load"
                how = f"as named ({fits})"
            else:
                how = f"the best quantization that fits ({m.quant or '?'})"
            return m, f"{how}: needs ~{total / MIB:.0f} MiB at n_ctx {MIN_CONTEXT}, {room}"
    smallest = min(candidates, key=lambda m: m.size)
    raise ConfigError(
        f"pull: {repo}: {smallest.name} needs ~{(smallest.size + rest) / MIB:.0f} MiB at n_ctx "
        f"{MIN_CONTEXT}; {usable / MIB:.0f} MiB usable in {where}: name a smaller :QUANT"
    )


def fitting_context(path: Path, model, usable: int, gpu: bool = False) -> int:
    """The largest n_ctx up to DEFAULT_CONTEXT that fits (the other parts of a split model
    counted beside the first's header)."""
    from localserve.runners.footprint import largest_context
    from localserve.runners.gguf_header import read_header

    others = model.size - model.files[0].size
    cfg = ModelConfig(path=str(path))
    cells = largest_context(read_header(path), cfg, usable - others, gpu)
    return max(256, min(cells, DEFAULT_CONTEXT))


def entry_name(repo: str, quant: str) -> str:
    base = re.sub(r"[-_.]?gguf$", "", repo.split("/")[1], flags=re.IGNORECASE).lower()
    return f"{base}-{quant.lower()}" if quant else base


def _check_free(name: str, existing: str, target: Path) -> None:
    try:
        models = tomllib.loads(existing).get("models", {})
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{target}: not valid TOML: {e}") from None
    if name in models:
        raise ConfigError(
            f"pull: {target} already has [models.{name}]: pass --name for a new entry"
        )


def entry_text(name: str, path: Path, n_ctx: int) -> str:
    """The models.toml entry (TOML strings written as JSON ones, which TOML reads alike)."""
    return (
        f"\n[models.{json.dumps(name)}]  # localserve pull\n"
        f"path = {json.dumps(str(path))}\n"
        'chat_format = "template"  # the GGUF\'s own chat template\n'
        f"n_ctx = {n_ctx}\n"
    )
