"""GGUF files on the Hugging Face Hub: list a repository's, size one before fetching it, fetch it.

Everything goes through `huggingface_hub`, so HF_ENDPOINT, HF_HOME (its cache, where files land)
and HF_TOKEN are honoured as every Hugging Face tool honours them. A download that loses its
connection is resumed by huggingface_hub (a Range request from where it stopped, a few tries);
huggingface_hub 2.x writes each download to a file of its own process, so a download killed
with its process starts again next time. Each file is checked against the sha256 the hub
reports for it (its LFS object id) before it is used; a file that does not match is deleted.

Tested in tests/e2e/test_pull.py.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from localserve.config import ConfigError
from localserve.runners.gguf_header import GgufHeader, TruncatedHeader, parse_header

SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
QUANT = re.compile(r"(I?Q\d_(?:K_[SML]|K|\d|[SMLX]+|XXS|XS|NL)|BF16|F16|F32)", re.IGNORECASE)
# the quantizations tried when none is named, best first: Q4_K_M (llama.cpp's and Ollama's
# usual choice, near Q8_0's quality at half its size), then smaller ones for less memory
PREFERRED = ("Q4_K_M", "Q4_K_S", "IQ4_XS", "Q3_K_M", "Q3_K_S", "IQ3_M", "Q2_K")
HEADER_LIMIT = 64 << 20  # the most of a file read to find its header


@dataclass(frozen=True)
class HubFile:
    name: str
    size: int
    sha256: str | None


@dataclass(frozen=True)
class HubModel:
    """One model in a repository: a GGUF file, or the parts of a split one, in order."""

    quant: str  # "Q4_K_M", ... ("" when the name says none)
    files: tuple[HubFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def name(self) -> str:
        return self.files[0].name


def parse_spec(spec: str) -> tuple[str, str | None, str | None]:
    """ORG/REPO[:QUANT] or ORG/REPO/FILE.gguf, or a Hub address pasted from a browser (see
    from_url) -> (repo, quant, file)."""
    spec = from_url(spec.strip())
    repo, _, quant = spec.partition(":")
    parts = repo.split("/")
    file = None
    if len(parts) > 2 and parts[-1].lower().endswith(".gguf"):
        repo, file = "/".join(parts[:2]), "/".join(parts[2:])
    if len(repo.split("/")) != 2 or not all(repo.split("/")) or (quant and file):
        raise ConfigError(f"pull: {spec!r} is not ORG/REPO, ORG/REPO:QUANT or ORG/REPO/FILE.gguf")
    return repo, quant.upper() or None, file


def from_url(spec: str) -> str:
    """A model's Hub address as pull takes it: https://huggingface.co/ORG/REPO (or hf.co, with
    or without the scheme; Ollama's hf.co/ORG/REPO:QUANT) -> ORG/REPO[:QUANT]; its file's page
    or download link (.../blob/main/FILE.gguf, .../resolve/main/FILE.gguf) -> ORG/REPO/FILE.gguf;
    its file list (.../tree/main) -> ORG/REPO. Anything else that is not an address is returned
    as it is; an address pull cannot take is a ConfigError saying why."""
    if "://" not in spec and not _HUB_PREFIX.match(spec):
        return spec
    url = urllib.parse.urlsplit(spec if "://" in spec else f"https://{spec}")
    if url.scheme.lower() not in ("http", "https") or (url.hostname or "") not in _hub_hosts():
        raise ConfigError(
            f"pull: {spec}: not a Hugging Face Hub address (huggingface.co or hf.co): "
            "give ORG/REPO, ORG/REPO:QUANT or ORG/REPO/FILE.gguf"
        )
    parts = [urllib.parse.unquote(p) for p in url.path.split("/") if p]
    if parts and parts[0] in ("datasets", "spaces"):
        raise ConfigError(f"pull: {spec}: a Hub {parts[0][:-1]}, not a model repository")
    if len(parts) < 2:
        raise ConfigError(f"pull: {spec}: no ORG/REPO in it")
    repo, rest = "/".join(parts[:2]), parts[2:]
    if not rest:
        return repo
    if rest[0] not in ("blob", "resolve", "tree") or len(rest) < 2:
        raise ConfigError(f"pull: {spec}: expected a repository, a file or a file list of it")
    if rest[1] != "main":
        raise ConfigError(f"pull: {spec}: revision {rest[1]!r}: pull fetches the main revision")
    file = "/".join(rest[2:])
    if rest[0] == "tree":
        return repo  # a folder of the repository: its models are listed whatever the folder
    if not file.lower().endswith(".gguf"):
        raise ConfigError(f"pull: {spec}: {file or 'the file'} is not a .gguf file")
    return f"{repo}/{file}"


_HUB_PREFIX = re.compile(r"(www\.)?(huggingface\.co|hf\.co)/", re.IGNORECASE)


def _hub_hosts() -> set[str]:
    """The Hub's host names, and HF_ENDPOINT's (a mirror, or the tests' stand-in hub)."""
    from huggingface_hub import constants

    endpoint = urllib.parse.urlsplit(constants.ENDPOINT).hostname or ""
    return {"huggingface.co", "www.huggingface.co", "hf.co", endpoint.lower()} - {""}


def _hub_error(repo: str, e: Exception) -> ConfigError:
    """One clear line for what huggingface_hub or the network raised."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        RepositoryNotFoundError,
    )

    if isinstance(e, GatedRepoError):
        return ConfigError(f"pull: {repo} is gated: accept its terms on the hub and set HF_TOKEN")
    if isinstance(e, RepositoryNotFoundError):
        return ConfigError(f"pull: no such repository {repo} on {constants.ENDPOINT} (or private)")
    if isinstance(e, EntryNotFoundError):
        return ConfigError(f"pull: {repo}: the file is not in the repository")
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return ConfigError(f"pull: the disk is full (HF_HOME: {constants.HF_HOME})")
    return ConfigError(f"pull: cannot reach {constants.ENDPOINT} ({type(e).__name__}: {e})")


def list_models(repo: str) -> list[HubModel]:
    """The repository's GGUF models (split files grouped), with sizes and sha256s."""
    from huggingface_hub import HfApi, constants

    try:
        info = HfApi(endpoint=constants.ENDPOINT).model_info(repo, files_metadata=True)
    except Exception as e:  # huggingface_hub's errors and the network's, said in one line
        raise _hub_error(repo, e) from None
    groups: dict[str, list[HubFile]] = {}
    for s in info.siblings or []:
        if not s.rfilename.lower().endswith(".gguf"):
            continue
        sha = s.lfs.sha256 if s.lfs else None
        key = SPLIT.sub("", s.rfilename)
        groups.setdefault(key, []).append(HubFile(s.rfilename, s.size or 0, sha))
    models = []
    for files in groups.values():
        files.sort(key=lambda f: f.name)
        m = QUANT.search(Path(files[0].name).name)
        models.append(HubModel(m[1].upper() if m else "", tuple(files)))
    return models


def pick(models: list[HubModel], quant: str | None, file: str | None, repo: str) -> list[HubModel]:
    """The candidates for what was asked: the named file or quantization, else the preferred
    quantizations present (best first); ConfigError when none is there."""
    if not models:
        raise ConfigError(f"pull: {repo} has no .gguf file")
    if file is not None:
        found = [m for m in models if any(f.name == file for f in m.files)]
        if not found:
            raise ConfigError(f"pull: {repo} has no file {file} (it has {_names(models)})")
        return found
    if quant is not None:
        found = [m for m in models if m.quant == quant]
        if not found:
            raise ConfigError(f"pull: {repo} has no {quant} file (it has {_quants(models)})")
        return found
    ranked = [m for q in PREFERRED for m in models if m.quant == q]
    return ranked or sorted(models, key=lambda m: m.size)


def _names(models: list[HubModel]) -> str:
    return ", ".join(m.name for m in models[:8]) + (" ..." if len(models) > 8 else "")


def _quants(models: list[HubModel]) -> str:
    return ", ".join(sorted({m.quant or m.name for m in models}))


def remote_header(repo: str, file: str) -> GgufHeader:
    """The header of a file on the hub, read with Range requests (a few MiB, not the file)."""
    from huggingface_hub import constants, get_session, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    url, size = hf_hub_url(repo, file, endpoint=constants.ENDPOINT), 1 << 20
    while True:
        headers = build_hf_headers() | {"Range": f"bytes=0-{size - 1}"}
        try:
            r = get_session().get(url, headers=headers, follow_redirects=True)
            r.raise_for_status()
        except Exception as e:
            raise _hub_error(repo, e) from None
        try:
            return parse_header(r.content)
        except TruncatedHeader:
            if len(r.content) < size or size >= HEADER_LIMIT:
                raise ConfigError(f"pull: {repo}/{file}: its GGUF header is cut short") from None
            size *= 4
        except ValueError as e:
            raise ConfigError(f"pull: {repo}/{file}: {e}") from None


Progress = Callable[[HubFile, int], None]  # a file, and how many of its bytes are here


def download(repo: str, model: HubModel, progress: Progress | None = None) -> Path:
    """Fetch every file of `model` into huggingface_hub's cache (a progress bar on stderr),
    each checked against the hub's sha256; the first file's path (llama.cpp finds the other
    parts of a split model beside it). `progress` is told, about four times a second from a
    thread of its own, how much of the file being fetched is on disk (huggingface_hub writes
    it to an `.incomplete` file in the repository's cache folder), and once more when whole."""
    import shutil

    from huggingface_hub import constants, hf_hub_download

    cache = Path(constants.HF_HUB_CACHE)
    cache.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cache).free
    if free < model.size:
        raise ConfigError(
            f"pull: the disk is full: {model.name} needs {model.size / 2**30:.1f} GiB, "
            f"{free / 2**30:.1f} GiB free in {cache} (HF_HOME)"
        )
    paths = []
    folder = cache / f"models--{repo.replace('/', '--')}" / "blobs"
    for f in model.files:
        with _watching(folder, f, progress):
            try:
                fetched = hf_hub_download(
                    repo, f.name, endpoint=constants.ENDPOINT, cache_dir=cache
                )
            except Exception as e:
                raise _hub_error(repo, e) from None
        path = Path(fetched)
        if progress is not None:
            progress(f, f.size)
        check_sha256(path, f)
        paths.append(path)
    return paths[0]


@contextlib.contextmanager
def _watching(folder: Path, f: HubFile, progress: Progress | None) -> Iterator[None]:
    """Tell `progress` the size of the `.incomplete` files in `folder` while the block runs."""
    if progress is None:
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.25):
            with contextlib.suppress(OSError):
                here = sum(p.stat().st_size for p in folder.glob("*.incomplete"))
                progress(f, min(here, f.size))

    watcher = threading.Thread(target=watch, name="localserve-pull-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def check_sha256(path: Path, f: HubFile) -> None:
    """The file's sha256 against the hub's; a file that differs is removed from the cache."""
    if f.sha256 is None:
        raise ConfigError(f"pull: the hub gives no sha256 for {f.name}: it cannot be checked")
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while block := src.read(8 << 20):
            digest.update(block)
    if digest.hexdigest() != f.sha256:
        real = path.resolve()
        path.unlink(missing_ok=True)
        real.unlink(missing_ok=True)
        raise ConfigError(
            f"pull: {f.name} is corrupt: its sha256 is {digest.hexdigest()[:16]}..., the hub "
            f"says {f.sha256[:16]}...; it was deleted, not added (run pull again)"
        )
