"""Ollama's `/api/pull` for the operator (issue 50), with the real `ollama` package against a
stand-in for the Hugging Face Hub on loopback (tests/support/fake_hub.py, HF_ENDPOINT pointed at
it) serving the embedded model with a chat template written in: with the monitor token the pull
streams its progress, the entry lands in the server's models.toml, the model is listed at once
and answers; a user's token is a 403 that says whose job it is, no token a 401; a server on its
built-in models says it has nowhere to put one. No test reaches the internet."""

from __future__ import annotations

import tomllib
from pathlib import Path

import ollama
import pytest

from localserve.config import load_config
from localserve.ops.auth import Access
from tests.support.fake_hub import FakeHub
from tests.support.paths import ROOT, templated_gguf

pytestmark = pytest.mark.model

TEMPLATE = ROOT / "tests" / "data" / "templates" / "google-gemma-3-4b-it.jinja"
REPO = "google/gemma-3-270m-GGUF"
SPEC = f"hf.co/{REPO}:Q4_K_M"  # as `ollama pull` names a Hub model
PULLED = "gemma-3-270m-q4_k_m"  # the entry `localserve pull` makes of it
MONITOR, ANN = "monitor-secret", "ann-secret"
MODELS = """\
default = "gemma-3-270m"

[models."gemma-3-270m"]
embedded = true
chat_format = "transcript"
chat_template = "gemma"
n_ctx = 2048
n_threads = 2
"""


@pytest.fixture
def hub(tmp_path, monkeypatch):
    served = tmp_path / "hub" / "gemma-3-270m-Q4_K_M.gguf"
    served.parent.mkdir()
    served.symlink_to(templated_gguf(TEMPLATE))
    fake = FakeHub({REPO: {served.name: served}})
    # the pull runs in a process of its own: it reads the hub's address from the environment
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    yield fake
    fake.close()


@pytest.fixture
def server(tmp_path):
    from localserve.serve.serving import serving

    toml = tmp_path / "models.toml"
    toml.write_text(MODELS)
    config = load_config(toml)
    config.server.state_dir = str(tmp_path / "state")
    access = Access({"ann": ANN}, monitor_token=MONITOR)
    with serving(config, access=access, thread=True, models_file=toml) as served:
        yield served


def client(served, token: str | None) -> ollama.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return ollama.Client(host=served.thread.http, timeout=300, headers=headers)


def test_only_the_operator_pulls_a_model_that_is_then_listed_and_answers(hub, server):
    with pytest.raises(ollama.ResponseError) as refused:  # a user's token: the wrong kind
        client(server, ANN).pull(SPEC)
    assert refused.value.status_code == 403 and "monitor token" in refused.value.error
    with pytest.raises(ollama.ResponseError) as nobody:
        client(server, None).pull(SPEC)
    assert nobody.value.status_code == 401
    assert server.server.pool.names == ["gemma-3-270m"]
    operator = client(server, MONITOR)
    progress = list(operator.pull(SPEC, stream=True))
    statuses = [p.status for p in progress]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
    sizes = [(p.completed, p.total) for p in progress if p.total]
    assert sizes and sizes[-1][0] == sizes[-1][1] > 200 << 20, sizes[-3:]
    assert progress[-2].status == "writing manifest"
    entry = tomllib.loads(Path(server.server.pool.models_file).read_text())["models"][PULLED]
    assert entry["chat_format"] == "template" and Path(entry["path"]).is_file()
    ann = client(server, ANN)
    assert f"{PULLED}:latest" in [m.model for m in ann.list().models]
    reply = ann.chat(model=PULLED, messages=[{"role": "user", "content": "Hi"}],
                     options={"num_predict": 3})  # fmt: skip
    assert reply.done and reply.prompt_eval_count > 3
    with pytest.raises(ollama.ResponseError) as again:  # never clobbered: it says so
        operator.pull(SPEC, stream=False)
    assert f"already has [models.{PULLED}]" in again.value.error
