"""llama.cpp's devices and its RPC backend, through ctypes (the library llama-cpp-python ships).

llama.cpp keeps a registry of devices: the CPU, GPUs, and — once a worker is added — the
devices of `localserve worker` processes on other machines, reached over its RPC protocol. This
module lists them, runs the RPC server of a worker (`ggml_backend_rpc_start_server`, no separate
binary), and registers workers' devices before a model loads.

Two traps, both verified with llama-cpp-python 0.3.36:

- The registry lives in `libggml.so.0`, which llama_cpp loaded with RTLD_GLOBAL. Opening the
  library under another name maps a second copy with a registry of its own, whose devices llama
  never sees: so it is opened by exactly that name, after llama_cpp.
- `llama_supports_gpu_offload()` is true in every build with the RPC backend (it counts RPC as
  offload), GPU or not: `has_local_gpu()` asks the registry instead.

And one hazard: llama.cpp's RPC client aborts its process when a worker is unreachable or dies
(SIGABRT, nothing Python can catch), and hangs when a worker stops answering. Whatever adds a
worker must run in a process that may die.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import NamedTuple

CPU, GPU, IGPU, ACCEL = 0, 1, 2, 3  # enum ggml_backend_dev_type
TYPE_NAMES = {CPU: "CPU", GPU: "GPU", IGPU: "iGPU", ACCEL: "accelerator"}


class BackendDevice(NamedTuple):
    """One device of llama.cpp's registry (ggml's backend devices): a local one or a worker's."""

    name: str  # "CPU", "CUDA0", "RPC0", ...
    description: str
    kind: str  # CPU, GPU, iGPU, accelerator
    free_bytes: int
    total_bytes: int

    @property
    def is_remote(self) -> bool:
        return self.name.startswith("RPC")


@functools.cache
def _ggml() -> ctypes.CDLL:
    import llama_cpp  # loads libllama and, through it, libggml.so.0 (RTLD_GLOBAL)

    lib = ctypes.CDLL(
        str(Path(llama_cpp.__file__).parent / "lib" / "libggml.so.0"), mode=ctypes.RTLD_GLOBAL
    )
    dev, reg = ctypes.c_void_p, ctypes.c_void_p
    signatures = {
        "ggml_backend_dev_count": ([], ctypes.c_size_t),
        "ggml_backend_dev_get": ([ctypes.c_size_t], dev),
        "ggml_backend_dev_name": ([dev], ctypes.c_char_p),
        "ggml_backend_dev_description": ([dev], ctypes.c_char_p),
        "ggml_backend_dev_type": ([dev], ctypes.c_int),
        "ggml_backend_dev_memory": (
            [dev, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
            None,
        ),
        "ggml_backend_reg_by_name": ([ctypes.c_char_p], reg),
        "ggml_backend_reg_get_proc_address": ([reg, ctypes.c_char_p], ctypes.c_void_p),
        "ggml_backend_register": ([reg], None),
    }
    for name, (args, result) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return lib


def devices() -> list[BackendDevice]:
    """Every device llama.cpp knows now: local ones, and remote ones once workers are added."""
    lib = _ggml()
    found = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        found.append(
            BackendDevice(
                lib.ggml_backend_dev_name(dev).decode(errors="replace"),
                (lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                TYPE_NAMES.get(lib.ggml_backend_dev_type(dev), "other"),
                free.value,
                total.value,
            )
        )
    return found


def has_local_gpu() -> bool:
    """A GPU in this machine that llama.cpp can use (RPC devices are not counted)."""
    return any(d.kind in ("GPU", "iGPU") and not d.is_remote for d in devices())


def supports_rpc() -> bool:
    import llama_cpp

    return bool(llama_cpp.llama_supports_rpc())


def _rpc_function(name: str):
    lib = _ggml()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    address = lib.ggml_backend_reg_get_proc_address(reg, name.encode()) if reg else None
    if not address:
        raise RuntimeError(
            "this llama.cpp build has no RPC backend: run `make setup` (it builds with "
            "-DGGML_RPC=on)"
        )
    return address


def start_server(endpoint: str, cache_dir: str | None, n_threads: int, names: list[str]) -> None:
    """Serve these local devices at endpoint ("host:port") until the process ends (blocks;
    ctypes releases the GIL meanwhile). One client at a time, and llama.cpp's listen backlog is
    1: do not probe it with a connection to see whether it is up, that takes its place."""
    lib = _ggml()
    by_name = {
        lib.ggml_backend_dev_name(dev).decode(): dev
        for dev in (lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count()))
    }
    chosen = (ctypes.c_void_p * len(names))(*(by_name[name] for name in names))
    start = ctypes.CFUNCTYPE(
        None,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p),
    )(_rpc_function("ggml_backend_rpc_start_server"))
    cache = cache_dir.encode() if cache_dir else None
    start(endpoint.encode(), cache, n_threads, len(names), chosen)


def listening(port: int) -> bool | None:
    """Whether a socket of this machine listens on the TCP port (Linux's /proc/net; None where
    that cannot be read). Unlike connecting, looking takes no place in a worker's backlog."""
    found = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        found = found or False
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                return True
    return found


def add_worker(endpoint: str) -> None:
    """Register a worker's devices (they appear as RPC0, RPC1, ...) before a model loads.

    An unreachable worker aborts this process (llama.cpp's RPC client): call it only in a
    process that may die."""
    add = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(
        _rpc_function("ggml_backend_rpc_add_server")
    )
    reg = add(endpoint.encode())
    if not reg:
        raise RuntimeError(f"RPC worker {endpoint}: llama.cpp did not register it")
    _ggml().ggml_backend_register(reg)


# llama.cpp's RPC protocol (ggml-rpc.cpp, protocol 7 in llama-cpp-python 0.3.36): a client opens
# with | RPC_CMD_HELLO (1 byte) | request size (8 bytes, LE) | conn_caps (24 bytes) | and the server
# answers | size (8 bytes) | major, minor, patch, padding, conn_caps (24 bytes) |. Zero caps ask
# for no transport upgrade.
_RPC_CMD_HELLO = 14
_CAPS_SIZE = 24
_RPC_PROTO_MAJOR = 7


def probe(endpoint: str, timeout: float = 2.0) -> str | None:
    """None when a worker at endpoint answers llama.cpp's RPC hello within timeout; else why not,
    in a few words ("connection refused", "not answering", ...).

    Pure Python, so it cannot abort this process as llama.cpp's client would. A worker serves
    one client at a time: while an engine is connected to it, its answer waits for that one."""
    import socket
    import struct

    from localserve.config import parse_endpoint

    parsed = parse_endpoint(endpoint)
    if parsed is None:
        return "not host:port"
    hello = bytes([_RPC_CMD_HELLO]) + struct.pack("<Q", _CAPS_SIZE) + bytes(_CAPS_SIZE)
    try:
        with socket.create_connection(parsed, timeout=timeout) as sock:
            sock.sendall(hello)
            answer = b""
            while len(answer) < 8 + 4:
                chunk = sock.recv(64)
                if not chunk:
                    return "closed the connection (not a localserve worker?)"
                answer += chunk
    except ConnectionRefusedError:
        return "connection refused (no worker listening)"
    except TimeoutError:
        return f"not answering within {timeout:g} s (stopped or overloaded?)"
    except OSError as e:
        return e.strerror or str(e)
    size, major = struct.unpack_from("<Q", answer)[0], answer[8]
    if size != 4 + _CAPS_SIZE or major != _RPC_PROTO_MAJOR:
        return f"speaks RPC protocol {major}; this build speaks {_RPC_PROTO_MAJOR}"
    return None


def refuses(endpoint: str, timeout: float = 0.3) -> str | None:
    """Why a worker's port refuses connections (its process is gone), else None.

    A connection only, no hello: a live worker serving an engine answers nobody else until that
    engine leaves, and one that was stopped (SIGSTOP) still accepts; neither is said gone."""
    import socket

    from localserve.config import parse_endpoint

    parsed = parse_endpoint(endpoint)
    if parsed is None:
        return "not host:port"
    try:
        socket.create_connection(parsed, timeout=timeout).close()
    except ConnectionRefusedError:
        return "connection refused (no worker listening)"
    except OSError:  # no answer in time, no route: not known to be gone
        return None
    return None
