"""Where does an HTTP request's TTFT go, against a websocket's? Server-side stamps at c=16.

Runs `localserve serve`'s server in this process (models.toml, port 8777) with its methods
wrapped to stamp each request: arrival (ws: its chat frame handled; HTTP: its head parsed by
uvicorn) -> submit (admission) -> add_request (after the prompt builder) -> first token event,
and the engine's own TTFT. Then `localserve bench` (16 users, `short`, 64 requests) alternates the
websocket path and /v1/chat/completions, three rounds. Run: `.venv/bin/python
benchmarks/issue11_probe.py` (a measurement tool: it patches the server, not for production).
"""

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from localserve.serve.websocket import connection as C
from localserve.serve import server as S
from localserve.serve import transport as T
from localserve.ops.auth import Access
from localserve.config import load_config
from localserve.engine.engine import Engine
from localserve.engine.events import Done, Token
from localserve.runners.models import open_runner

config = load_config(str(ROOT / "models.toml"))
name = config.default
runner = open_runner(config, name)
engine = Engine(runner, config.scheduler).start()
server = S.Server(engine, runner, config.models[name], config.server, Access({}))
stamps = {}  # engine id -> dict

orig_headers = T.GuardedHTTP.on_headers_complete
def on_headers_complete(self):
    self._t0 = time.perf_counter()
    orig_headers(self)
    if self.cycle is not None:
        self.cycle.scope["t0"] = self._t0
T.GuardedHTTP.on_headers_complete = on_headers_complete

orig_handle = C.Connection.handle
async def handle(self, message):
    self._t0 = time.perf_counter()
    return await orig_handle(self, message)
C.Connection.handle = handle

orig_submit = S.Server.submit
async def submit(self, sink, user, client_id, engine_id, fields, prompt):
    t = time.perf_counter()
    t0 = getattr(sink, "_t0", None) or getattr(sink, "scope", {}).get("t0")
    stamps[engine_id] = {"arrival": t0, "submit": t}
    return await orig_submit(self, sink, user, client_id, engine_id, fields, prompt)
S.Server.submit = submit

orig_add = engine.add_request
def add_request(request_id, *a, **k):
    stamps[request_id]["add"] = time.perf_counter()
    return orig_add(request_id, *a, **k)
engine.add_request = add_request

orig_route = S.Server._route
def _route(self, request, event):
    d = stamps.get(request.engine_id)
    if d is not None:
        if isinstance(event, Token) and "token" not in d:
            d["token"] = time.perf_counter()
        if isinstance(event, Done):
            d["engine_ttft"] = event.timings["ttft_ms"]
    return orig_route(self, request, event)
S.Server._route = _route

thread = S.ServerThread(server, port=8777)
LS = str(ROOT / ".venv/bin/localserve")
def bench(*args):
    subprocess.run([LS, "bench", *args, "--workload", "short", "--num-requests", "64",
                    "--concurrency", "16", "--ignore-eos"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
bench("--url", "ws://127.0.0.1:8777")  # warm-up
rows = {}
for rnd in range(3):
    for path, args in (("ws", ["--url", "ws://127.0.0.1:8777"]),
                       ("http", ["--peer", "http://127.0.0.1:8777", "--endpoint", "chat"])):
        stamps.clear()
        bench(*args)
        for d in stamps.values():
            if "token" in d and d["arrival"]:
                r = rows.setdefault(path, {k: [] for k in ("to_submit", "tokenize", "to_token", "engine_ttft")})
                r["to_submit"].append((d["submit"] - d["arrival"]) * 1e3)
                r["tokenize"].append((d["add"] - d["submit"]) * 1e3)
                r["to_token"].append((d["token"] - d["add"]) * 1e3)
                r["engine_ttft"].append(d["engine_ttft"])
for path, r in rows.items():
    print(path, {k: (round(statistics.median(v), 2), round(statistics.mean(v), 2), len(v)) for k, v in r.items()})
thread.close(); engine.stop(); runner.close()
