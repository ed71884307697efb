"""llama.cpp's RPC backend (localserve/runners/rpc.py): the build has it, and sees no GPU that
is not there. The workers themselves, run as processes, are in e2e/test_rpc_workers.py."""

from __future__ import annotations

import os

from localserve.runners import rpc


def test_the_build_has_the_rpc_backend_and_no_gpu_is_imagined():
    assert rpc.supports_rpc()
    names = [d.name for d in rpc.devices()]
    assert "CPU" in names and not any(name.startswith("RPC") for name in names)
    if not os.path.exists("/proc/driver/nvidia/gpus"):
        # llama_supports_gpu_offload() says yes to any RPC build; the registry does not
        assert not rpc.has_local_gpu()
