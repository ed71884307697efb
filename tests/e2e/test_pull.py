"""`localserve pull` end to end against a stand-in for the Hugging Face Hub on loopback
(tests/support/fake_hub.py, HF_ENDPOINT pointed at it) serving the embedded model with a chat
template written in: the right file is chosen and fetched, the entry written, and the model
then loads and answers a chat on the real engine; a dropped connection is resumed; a corrupted
file is refused; each slip is one line. No test reaches the internet."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import openai
import pytest

from tests.support.cli import localserve, slip_line
from tests.support.fake_hub import FakeHub
from tests.support.paths import ROOT, templated_gguf

pytestmark = pytest.mark.model

TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "templates" / "google-gemma-3-4b-it.jinja"
REPO = "google/gemma-3-270m-GGUF"


@pytest.fixture(scope="module")
def templated(tmp_path_factory) -> Path:
    """The embedded GGUF with a chat template, as the hub's Q4_K_M file (a link to the copy
    written once and kept: tests/support/paths.py)."""
    out = tmp_path_factory.mktemp("hub") / "gemma-3-270m-Q4_K_M.gguf"
    out.symlink_to(templated_gguf(TEMPLATE))
    return out


@pytest.fixture
def hub(templated, tmp_path):
    q8 = tmp_path / "gemma-3-270m-Q8_0.gguf"  # a bigger quantization the choice must pass over
    q8.write_bytes(templated.read_bytes() + b"\0" * 1024)
    fake = FakeHub({REPO: {templated.name: templated, q8.name: q8}, "empty/repo": {}})
    yield fake
    fake.close()


def pull(hub, tmp_path, *argv):
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1"}
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "0"
    return localserve("pull", *argv, env=env, cwd=tmp_path, timeout=300)


def test_a_pull_picks_q4_k_m_writes_the_entry_and_the_model_answers(hub, tmp_path):
    # the first GET stops after 40 MiB (past a few of huggingface_hub's 10 MiB chunks): resumed
    hub.drop_after = 40 << 20
    ran = pull(hub, tmp_path, REPO)
    assert ran.returncode == 0, ran.stderr
    assert "gemma-3-270m-Q4_K_M.gguf" in ran.stderr and "best quantization that fits" in ran.stderr
    assert any(
        r.startswith("bytes=") and r != "bytes=0-" and int(r[6:].split("-")[0]) >= 10 << 20
        for r in hub.ranges
    ), hub.ranges
    entry = tomllib.loads((tmp_path / "models.toml").read_text())["models"]
    model = entry["gemma-3-270m-q4_k_m"]
    assert model["chat_format"] == "template" and "chat_template" not in model
    assert (
        Path(model["path"]).read_bytes() == hub.repos[REPO]["gemma-3-270m-Q4_K_M.gguf"].read_bytes()
    )
    assert str(tmp_path / "hf") in model["path"] and 256 <= model["n_ctx"] <= 8192
    again = pull(hub, tmp_path, REPO)  # never clobbered
    assert "already has [models.gemma-3-270m-q4_k_m]" in slip_line(again, "--name")
    with serving(tmp_path, "gemma-3-270m-q4_k_m") as url:  # the server loads it and answers
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        reply = client.chat.completions.create(
            model="gemma-3-270m-q4_k_m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.prompt_tokens > 3


@contextlib.contextmanager
def serving(cwd: Path, model: str):
    """`localserve serve --model MODEL` with cwd's models.toml, on a free port: its http URL."""
    command = [sys.executable, "-m", "localserve", "serve", "--model", model, "--port", "0"]
    env = os.environ | {"LOCALSERVE_STATE_DIR": str(cwd / "state"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        for line in proc.stdout:
            if found := re.search(r"on ws://(127\.0\.0\.1:\d+)", line):
                threading.Thread(target=proc.stdout.read, daemon=True).start()  # drained
                yield f"http://{found[1]}"
                return
        raise AssertionError(f"the server exited: {proc.wait()}")
    finally:
        proc.terminate()
        proc.wait(60)


def test_a_corrupted_file_is_refused_and_not_added(hub, tmp_path):
    """Named by its download link, pasted as a browser gives it (HF_ENDPOINT's host)."""
    hub.corrupt = True
    pasted = f"{hub.url}/{REPO}/resolve/main/gemma-3-270m-Q4_K_M.gguf?download=true"
    ran = pull(hub, tmp_path, pasted)
    assert "pull: gemma-3-270m-Q4_K_M.gguf" in ran.stderr  # the file the link names
    assert ran.returncode == 2 and "Traceback" not in ran.stderr
    assert "is corrupt: its sha256" in ran.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "models.toml").exists()


def test_slips_are_one_line(hub, tmp_path):
    assert "no such repository nobody/nothing" in slip_line(pull(hub, tmp_path, "nobody/nothing"))
    assert "has no .gguf file" in slip_line(pull(hub, tmp_path, "empty/repo"))
    assert "has no Q2_K file (it has Q4_K_M, Q8_0)" in slip_line(
        pull(hub, tmp_path, f"{REPO}:q2_k")
    )
    assert "not ORG/REPO" in slip_line(pull(hub, tmp_path, "justaname"))
    pasted = f"{hub.url}/nobody/nothing/tree/main"  # an address: its repository asked for
    assert "no such repository nobody/nothing" in slip_line(pull(hub, tmp_path, pasted))
    line = slip_line(pull(hub, tmp_path, "https://github.com/google/gemma"))
    assert line == (
        "localserve: pull: https://github.com/google/gemma: not a Hugging Face Hub address "
        "(huggingface.co or hf.co): give ORG/REPO, ORG/REPO:QUANT or ORG/REPO/FILE.gguf"
    )
    hub.close()
    assert "cannot reach" in slip_line(pull(hub, tmp_path, REPO))
