"""`localserve worker` processes on loopback: a worker lends its devices and refuses a network
without consent, and a model split across the local CPU and two workers generates what the
unsplit one does (runners/rpc.py through the command line)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.support.workers import LOCALSERVE, Worker, free_port

PROMPT = "The capital of France is"


def test_a_worker_lists_its_devices_and_refuses_a_network_without_consent():
    listed = subprocess.run([*LOCALSERVE, "worker", "--list"], capture_output=True, text=True)
    assert listed.returncode == 0 and listed.stdout.startswith("CPU")
    refused = subprocess.run(
        [*LOCALSERVE, "worker", "--host", "0.0.0.0", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "--allow-network" in refused.stderr and "no authentication" in refused.stderr
    unknown = subprocess.run(
        [*LOCALSERVE, "worker", "--device", "CUDA7"], capture_output=True, text=True, timeout=60
    )
    assert unknown.returncode == 2 and "not on this machine" in unknown.stderr


@pytest.fixture
def split_config(tmp_path):
    """The embedded model with 12 of its 18 layers off the CPU: split over two workers."""
    path = tmp_path / "models.toml"
    path.write_text(
        'default = "gemma-3-270m"\n'
        '[models.gemma-3-270m]\nembedded = true\nchat_format = "transcript"\n'
        'chat_template = "gemma"\nn_ctx = 2048\nn_threads = 2\n'
        'n_gpu_layers = 12\nsplit_mode = "layer"\ntensor_split = [1, 1]\n'
    )
    return path


def generate(config, *rpc_endpoints: str) -> tuple[str, str]:
    command = [*LOCALSERVE, "--config", str(config), "generate", PROMPT, "--max-tokens", "24"]
    for endpoint in rpc_endpoints:
        command += ["--rpc", endpoint]
    env = os.environ | {"GGML_NO_BACKTRACE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


@pytest.mark.model
def test_a_model_split_over_two_workers_generates_what_the_whole_one_does(split_config):
    local_text, _ = generate(split_config)
    workers = [Worker(), Worker()]
    try:
        split_text, where = generate(split_config, *(w.endpoint for w in workers))
    finally:
        for w in workers:
            w.close()
    assert split_text.strip() and split_text == local_text  # greedy, token for token
    assert re.search(r"RPC0|RPC\[", where), where  # the start-up block names the workers
    # and lists each device with its layers and KV cache: 7 + 6 + 5 of the 18 layers
    first, second = (w.endpoint for w in workers)
    assert re.search(r"\n    CPU +7/18 layers +\d+ MiB KV", where), where
    assert re.search(rf"\n    RPC0 {first} +6/18 layers +\d+ MiB KV\n", where), where
    assert re.search(rf"\n    RPC1 {second} +5/18 layers +\d+ MiB KV", where), where
