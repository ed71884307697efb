"""A model pulled while serving: what Ollama's `POST /api/pull` does for the operator.

The pull is `localserve pull SPEC --progress-json` (cli/pull.py: the Hub's file chosen for this
machine, fetched into huggingface_hub's cache, its sha256 checked, the entry appended to the
server's models.toml), run as a process of its own so that the server's loop and the engines
never wait for the download. Its progress comes back as JSON lines, Ollama's pull progress
objects (`pulling manifest`, `pulling <digest>` with `total` and `completed`, `verifying
sha256 digest`, `writing manifest`), and is passed on as it comes; once the entry is written
the server reads it from models.toml and adds the model to its pool (listed at once, loaded
when first asked for), then says `success`. One pull runs at a time; the next waits. A client
that goes away ends its pull (the process is killed; a half-fetched file is huggingface_hub's
to resume next time).

Errors end the stream as Ollama's do, `{"error": ...}`: the pull's own one line (no such
repository, no file that fits, the entry's name taken, a corrupt file), or a server that runs
on its built-in models (no models.toml to add an entry to).

Tested in tests/e2e/test_ollama_pull.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator

from localserve.config import ConfigError, load_config
from localserve.serve.pool import ModelPool

MAX_LINE_BYTES = 64 << 10  # a progress line; the process is ours, its lines are short
MAX_ERROR_CHARS = 500


async def pull(pool: ModelPool, spec: str, name: str | None = None) -> AsyncIterator[dict]:
    """Ollama's progress objects for pulling `spec` into the server's models.toml and pool;
    the last is `{"status": "success"}` or `{"error": ...}`."""
    if pool.models_file is None:
        yield {
            "error": "this server runs on its built-in models (no models.toml): start it with "
            "a models.toml (--config or $LOCALSERVE_MODELS) to pull models into"
        }
        return
    # the client's text only after "--": a spec or name that looks like an option is not one
    argv = [sys.executable, "-m", "localserve", "pull", "--progress-json"]
    argv += ["--config", str(pool.models_file)] + ([f"--name={name}"] if name else [])
    argv += ["--", spec]
    async with pool.pull_lock:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=MAX_LINE_BYTES,
            env={**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"},
        )
        said = asyncio.create_task(_tail(process.stderr))  # read beside stdout: never full
        try:
            added = None
            async for event in _events(process):
                if event.get("status") == "success":
                    added = event.get("name")
                else:
                    yield event
            errors = await said
            if await process.wait() != 0 or not isinstance(added, str):
                yield {"error": _last_line(errors) or f"the pull ended ({process.returncode})"}
                return
        finally:
            if process.returncode is None:  # the client went away: the pull ends with it
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
            said.cancel()
        yield _added(pool, added)


async def _tail(stream) -> str:
    """What the pull said on stderr, its last few KiB."""
    kept = b""
    while chunk := await stream.read(4096):
        kept = (kept + chunk)[-8192:]
    return kept.decode(errors="replace")


async def _events(process) -> AsyncIterator[dict]:
    """The JSON objects the pull prints, one a line (anything else is skipped)."""
    while line := await process.stdout.readline():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                yield event


def _added(pool: ModelPool, name: str) -> dict:
    """The entry the pull wrote, read back and served."""
    try:
        model = load_config(pool.models_file).models.get(name)
    except ConfigError as e:
        return {"error": f"the model was fetched, but {e}"}
    if model is None:
        return {"error": f"the model was fetched, but {pool.models_file} has no [models.{name}]"}
    pool.add(name, model)
    return {"status": "success"}


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:MAX_ERROR_CHARS] if lines else ""
