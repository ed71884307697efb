"""Which HTTP stack should serve our websocket protocol and the OpenAI API on one port (issue 11)?

A one-off whose decision is made: uvicorn (httptools, websockets-sansio) with Starlette, chosen
in issue 11 from these figures (docs/benchmarks.md, "Choosing the stack"). Kept because it
imports nothing of localserve (it cannot go stale with the code) and is the way to revisit the
choice when a candidate's version moves; nothing else depends on it.

Candidates, each run as its own server subprocess pinned to CPU 0 (the client is pinned to CPU 1):

  A  websockets asyncio server alone: the old stack; websocket metrics only (it has no POST).
  B  uvicorn (httptools, websockets-sansio, asgi3) serving Starlette; websocket as raw ASGI,
     SSE as a raw ASGI response returned from a Starlette route.
  C  aiohttp web server (WebSocketResponse with compress=False, StreamResponse for SSE).

Every round starts all servers afresh and then runs each metric on A, B, C in turn, so load on
the machine hits the candidates alike. The client is one asyncio loop: the websockets client for
websockets (no compression), hand-written HTTP/1.1 keep-alive requests on raw streams for HTTP.

  ws echo       ~200-byte JSON text frame out, server decodes it (msgspec), ~100-byte frame back.
  POST          ~500-byte JSON body, ~300-byte JSON answer, keep-alive.
  SSE           one POST streaming N events of `data: {~150 B json}\\n\\n`, one chunk each.
  memory        server RSS just after start; KiB per idle websocket (64 opened after a warm-up).

Latency cells read "p50 over all rounds (lowest-highest per-round p50)", SSE "median (range)";
a wide spread means the machine was noisy.
Server CPU per op is the server's on-CPU time (/proc/<pid>/task/*/schedstat, ns) over the
timed ops: what the server itself pays, apart from client and scheduler time in the round trip.

Run (aiohttp is not a dependency: `.venv/bin/pip install aiohttp` first):

    .venv/bin/python benchmarks/http_stack_choice.py [--rounds 6]

Prints one markdown table (a row per metric, a column per candidate) and a line with message
sizes, load and duration; the summaries and per-round figures go to
bench-results/http_stack_choice.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path

import msgspec

HOST = "127.0.0.1"
NAMES = {"A": "websockets", "B": "uvicorn+starlette", "C": "aiohttp"}
OUT = Path(__file__).resolve().parent.parent / "bench-results" / "http_stack_choice.json"
enc, dec = msgspec.json.Encoder(), msgspec.json.Decoder()

WS_MSG = enc.encode({"type": "chat", "id": "r-000001", "user": "bob", "temperature": 0.7,
                     "max_tokens": 256, "messages": [{"role": "user", "content": "s" * 80}]})
POST_BODY = enc.encode({"model": "gemma-3-1b", "temperature": 0.7, "max_tokens": 256,
                        "messages": [{"role": "system", "content": "You are helpful. " * 6},
                                     {"role": "user", "content": "Tell me about the sea." * 13}]})
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def ws_reply(req: dict) -> str:
    return enc.encode({"type": "token", "id": req["id"], "index": len(req["messages"]),
                       "text": " the sea", "logprob": -0.4125, "final": False}).decode()


def chat_reply(req: dict) -> bytes:
    return enc.encode({
        "id": "chatcmpl-0123456789", "object": "chat.completion", "created": 1700000000,
        "model": req["model"],
        "choices": [{"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": "The sea is large, salty and deep. " * 2}}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 16, "total_tokens": 136}})


def sse_events(req: dict):
    for i in range(req["n_events"]):
        chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": req["model"],
                 "choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}]}
        yield b"data: " + enc.encode(chunk) + b"\n\n"


# ----------------------------------------------------------------------------- servers


def serve(kind: str, port: int) -> None:
    """One candidate stack on one core: A websockets, B uvicorn + Starlette, C aiohttp."""
    if len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {0})
    {"A": serve_websockets, "B": serve_uvicorn, "C": serve_aiohttp}[kind](port)


def _ready() -> None:
    print("ready", flush=True)


def serve_websockets(port: int) -> None:
    """A: the websockets library alone."""
    from websockets.asyncio.server import serve as ws_serve

    async def handler(ws):
        async for m in ws:
            await ws.send(ws_reply(dec.decode(m)))

    async def main_a():
        async with ws_serve(handler, HOST, port, compression=None, max_size=None) as srv:
            _ready()
            await srv.serve_forever()

    asyncio.run(main_a())


def serve_uvicorn(port: int) -> None:
    """B: uvicorn (httptools, websockets-sansio) with Starlette routes."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def chat(request):
        body = chat_reply(dec.decode(await request.body()))
        return Response(body, media_type="application/json")

    async def stream(request):
        req = dec.decode(await request.body())

        async def asgi(scope, receive, send):
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            for ev in sse_events(req):
                await send({"type": "http.response.body", "body": ev, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

        return asgi

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                            Route("/v1/stream", stream, methods=["POST"])])

    async def root(scope, receive, send):
        if scope["type"] != "websocket":
            return await app(scope, receive, send)
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while (m := await receive())["type"] == "websocket.receive":
            await send({"type": "websocket.send", "text": ws_reply(dec.decode(m["text"]))})

    server = uvicorn.Server(uvicorn.Config(
        root, host=HOST, port=port, http="httptools", ws="websockets-sansio",
        interface="asgi3", lifespan="off", log_config=None, access_log=False,
        proxy_headers=False))

    async def main_b():
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        _ready()
        await task

    asyncio.run(main_b())


def serve_aiohttp(port: int) -> None:
    """C: aiohttp for HTTP, SSE and websockets."""
    from aiohttp import WSMsgType, web

    async def chat(request):
        body = chat_reply(dec.decode(await request.read()))
        return web.Response(body=body, content_type="application/json")

    async def stream(request):
        req = dec.decode(await request.read())
        resp = web.StreamResponse(headers={k.decode(): v.decode() for k, v in SSE_HEADERS})
        await resp.prepare(request)
        for ev in sse_events(req):
            await resp.write(ev)
        await resp.write_eof()
        return resp

    async def ws_handler(request):
        ws = web.WebSocketResponse(compress=False)
        await ws.prepare(request)
        async for m in ws:
            if m.type == WSMsgType.TEXT:
                await ws.send_str(ws_reply(dec.decode(m.data)))
        return ws

    async def main_c():
        app = web.Application()
        app.add_routes([web.post("/v1/chat/completions", chat),
                        web.post("/v1/stream", stream), web.get("/ws", ws_handler)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, HOST, port).start()
        _ready()
        await asyncio.Event().wait()

    asyncio.run(main_c())


# ----------------------------------------------------------------------------- client


def cpu_s(pid: int) -> float:
    """On-CPU seconds of all the process's threads (schedstat: ns, unlike stat's 10 ms ticks)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(x for x in f if x.startswith("VmRSS:")).split()[1])


class Server:
    async def start(self, kind: str) -> Server:
        with socket.socket() as sock:
            sock.bind((HOST, 0))
            self.port = sock.getsockname()[1]
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--serve", kind, str(self.port),
            stdout=asyncio.subprocess.PIPE)
        assert await asyncio.wait_for(self.proc.stdout.readline(), 30) == b"ready\n"
        self.pid, self.ws_url = self.proc.pid, f"ws://{HOST}:{self.port}/ws"
        return self

    async def stop(self) -> None:
        self.proc.terminate()
        await asyncio.wait_for(self.proc.wait(), 10)


def connect(url: str):
    from websockets.asyncio.client import connect as ws_connect

    return ws_connect(url, compression=None, max_size=None)


async def timed(s: Server, n: int, op, check: bytes | str, warm: int = 200) -> dict:
    """n calls of op (one round trip each) after a warm-up; latencies and server CPU."""
    for _ in range(warm):
        assert check in await op()
    lat, cpu0 = [], cpu_s(s.pid)
    for _ in range(n):
        t = time.perf_counter_ns()
        await op()
        lat.append((time.perf_counter_ns() - t) / 1000)
    return {"lat_us": lat, "cpu_s": cpu_s(s.pid) - cpu0, "n": n}


async def ws_echo(s: Server, n: int) -> dict:
    msg = WS_MSG.decode()
    async with connect(s.ws_url) as ws:

        async def op():
            await ws.send(msg)
            return await ws.recv()

        return await timed(s, n, op, '"id":"r-000001"')


def request(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    low = head.lower()
    if (i := low.find(b"content-length:")) >= 0:
        return head, await reader.readexactly(int(low[i + 15 : low.index(b"\r\n", i)]))
    buf = bytearray()  # chunked (or close-delimited): read to the last chunk or EOF
    while not buf.endswith(b"\r\n0\r\n\r\n") and (data := await reader.read(1 << 16)):
        buf += data
    return head, bytes(buf)


async def http_post(s: Server, n: int) -> dict:
    reader, writer = await asyncio.open_connection(HOST, s.port)
    req = request("/v1/chat/completions", POST_BODY)

    async def op():
        writer.write(req)
        return (await read_response(reader))[1]

    res = await timed(s, n, op, b'"chat.completion"')
    writer.close()
    return res


async def sse(s: Server, n: int) -> dict:
    reader, writer = await asyncio.open_connection(HOST, s.port)
    for events in (100, n):  # a short warm-up stream first
        req = request("/v1/stream", enc.encode({"model": "gemma-3-1b", "n_events": events}))
        cpu0, t = cpu_s(s.pid), time.perf_counter()
        writer.write(req)
        head, body = await read_response(reader)
        dt, cpu = time.perf_counter() - t, cpu_s(s.pid) - cpu0
        assert body.count(b"data: ") == events, body.count(b"data: ")
    writer.close()
    chunked = b"transfer-encoding: chunked" in head.lower()
    return {"events_per_s": n / dt, "cpu_s": cpu, "n": n, "chunked": chunked}


async def memory(s: Server, conns: int = 64) -> dict:
    start = rss_kib(s.pid)
    async with connect(s.ws_url) as ws:  # warm-up: first connection pays one-off allocations
        await ws.send(WS_MSG.decode())
        await ws.recv()
    await asyncio.sleep(0.2)
    warm, open_ = rss_kib(s.pid), [await connect(s.ws_url) for _ in range(conns)]
    for ws in open_:
        await ws.send(WS_MSG.decode())
        await ws.recv()
    await asyncio.sleep(0.2)
    full = rss_kib(s.pid)
    for ws in open_:
        await ws.close()
    return {"rss_start_kib": start, "rss_warm_kib": warm, "rss_open_kib": full,
            "kib_per_conn": (full - warm) / conns}


async def bench(args) -> dict:
    res = {k: {"memory": [], "ws": [], "post": [], "sse": []} for k in NAMES}
    for r in range(args.rounds):
        servers = {k: await Server().start(k) for k in NAMES}
        await asyncio.sleep(0.5)
        for k, s in servers.items():
            res[k]["memory"].append(await memory(s))
        for k, s in servers.items():
            res[k]["ws"].append(await ws_echo(s, args.ws_n))
        for k in "BC":
            res[k]["post"].append(await http_post(servers[k], args.http_n))
        for k in "BC":
            res[k]["sse"].append(await sse(servers[k], args.sse_n))
        for s in servers.values():
            await s.stop()
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    return res


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summarize(blocks: list[dict], kind: str) -> dict:
    if not blocks:
        return {}
    if kind == "memory":
        return {"rss_start_mib": statistics.median(b["rss_start_kib"] for b in blocks) / 1024,
                "kib_per_conn": statistics.median(b["kib_per_conn"] for b in blocks)}
    n, cpu = sum(b["n"] for b in blocks), sum(b["cpu_s"] for b in blocks)
    if kind == "sse":
        eps = [b["events_per_s"] for b in blocks]
        return {"events_per_s": statistics.median(eps), "events_per_s_range": [min(eps), max(eps)],
                "cpu_ms_per_1000": cpu * 1e6 / n, "chunked": all(b["chunked"] for b in blocks)}
    lat, p50s = [x for b in blocks for x in b["lat_us"]], [pct(b["lat_us"], 0.5) for b in blocks]
    return {"p50_us": pct(lat, 0.5), "p50_us_range": [min(p50s), max(p50s)],
            "p99_us": pct(lat, 0.99), "server_cpu_us_per_op": cpu * 1e6 / n, "n": n}


ROWS = [  # label, metric, summary key, format; a key with a "_range" sibling shows it too
    ("ws echo p50 µs (round p50s)", "ws", "p50_us", ".0f"),
    ("ws echo p99 µs", "ws", "p99_us", ".0f"),
    ("ws echo server CPU µs/msg", "ws", "server_cpu_us_per_op", ".1f"),
    ("POST p50 µs (round p50s)", "post", "p50_us", ".0f"),
    ("POST p99 µs", "post", "p99_us", ".0f"),
    ("POST server CPU µs/req", "post", "server_cpu_us_per_op", ".1f"),
    ("SSE events/s (round range)", "sse", "events_per_s", ".0f"),
    ("SSE server CPU ms / 1000 events", "sse", "cpu_ms_per_1000", ".2f"),
    ("RSS after start MiB", "memory", "rss_start_mib", ".1f"),
    ("RSS KiB per idle websocket", "memory", "kib_per_conn", ".1f"),
]


def table(summ: dict) -> str:
    def cell(d: dict, key: str, f: str) -> str:
        if not d:
            return "n/a"
        lo_hi = d.get(key + "_range")
        return f"{d[key]:{f}}" + (f" ({lo_hi[0]:{f}}-{lo_hi[1]:{f}})" if lo_hi else "")

    out = ["| metric | " + " | ".join(f"{k} {v}" for k, v in NAMES.items()) + " |",
           "|---|" + "---|" * len(NAMES)]
    out += [f"| {label} | " + " | ".join(cell(summ[k][kind], key, f) for k in NAMES) + " |"
            for label, kind, key, f in ROWS]
    return "\n".join(out)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        return serve(sys.argv[2], int(sys.argv[3]))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--ws-n", type=int, default=3000)
    p.add_argument("--http-n", type=int, default=2000)
    p.add_argument("--sse-n", type=int, default=5000)
    args = p.parse_args()
    pinned = len(os.sched_getaffinity(0)) > 1
    if pinned:
        os.sched_setaffinity(0, {1})
    load0, t0 = os.getloadavg(), time.monotonic()
    res = asyncio.run(bench(args))
    summ = {k: {kind: summarize(v, kind) for kind, v in r.items()} for k, r in res.items()}
    meta = {"args": vars(args), "pinned": pinned, "cpus": os.cpu_count(), "python": sys.version,
            "loadavg_before": load0, "loadavg_after": os.getloadavg(),
            "seconds": round(time.monotonic() - t0, 1),
            "versions": {m: version(m) for m in
                         ("websockets", "uvicorn", "starlette", "httptools", "aiohttp", "msgspec")},
            "bytes": {"ws_msg": len(WS_MSG), "ws_reply": len(ws_reply(dec.decode(WS_MSG))),
                      "post_body": len(POST_BODY),
                      "post_reply": len(chat_reply(dec.decode(POST_BODY))),
                      "sse_event": len(next(sse_events({"model": "gemma-3-1b", "n_events": 1})))}}
    for r in res.values():  # keep raw latencies out of the JSON, summaries are enough
        for b in r["ws"] + r["post"]:
            b["lat_us"] = {"p50": pct(b["lat_us"], 0.5), "p99": pct(b["lat_us"], 0.99)}
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"meta": meta, "summary": summ, "rounds": res}, indent=1))
    print(table(summ))
    print(f"\nbytes {meta['bytes']}; load {load0} -> {meta['loadavg_after']}; "
          f"{meta['seconds']} s; JSON in {OUT.relative_to(OUT.parent.parent)}")


if __name__ == "__main__":
    main()
