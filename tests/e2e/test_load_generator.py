"""The load generator (localserve/bench/, through `localserve bench` too) against stand-in
servers on loopback (an OpenAI-style SSE endpoint, a websocket server speaking the protocol's
frames) and one smoke run against the real one. Its figures on synthetic timings are in
unit/bench/."""

from __future__ import annotations

import asyncio

import pytest

from localserve.bench.report import SLO, summarize
from localserve.bench.runs import run_conversations, run_load, single
from localserve.bench.targets import OpenAITarget, WebSocketTarget
from localserve.bench.workloads import RequestSpec, build_conversations, build_requests


@pytest.mark.model
def test_smoke_run_against_a_real_server(live):
    specs = build_requests("short", 6, seed=1)
    seen = []
    results, duration = asyncio.run(
        run_load(
            WebSocketTarget(live.url),
            specs,
            concurrency=2,
            ignore_eos=True,
            on_done=lambda d, t: seen.append(d),
        )
    )
    s = summarize(results, duration, SLO.parse("ttft=60000"))
    assert s["completed"] == 6 and s["failed"] == 0 and seen == [1, 2, 3, 4, 5, 6]
    assert s["output_tokens"] == 6 * 48  # ignore_eos: fixed lengths
    assert s["ttft_ms"]["median"] > 0 and s["itl_ms"]["p99"] >= s["itl_ms"]["median"]
    assert s["good_requests"] == 6
    live.wait_idle()


def write_sse(wfile, chunks: list[dict]) -> None:
    """Stream chunks as OpenAI-style server-sent events, then [DONE]."""
    import json

    for chunk in chunks:
        wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        wfile.flush()
    wfile.write(b"data: [DONE]\n\n")


def test_peer_mode_reads_an_openai_sse_stream():
    """The OpenAI-compatible client against a minimal SSE endpoint (the real peer is
    llama-server, used in the benchmarks; this checks the parsing and the timings)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            seen["path"] = self.path
            seen["body"] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunks = [{"choices": [{"text": t, "finish_reason": None}]} for t in ("Pa", "ris", ".")]
            chunks.append({"choices": [{"text": "", "finish_reason": "length"}]})
            chunks.append({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3}})
            write_sse(self.wfile, chunks)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        spec = RequestSpec("short", "What is the capital of France?", 3)
        r = asyncio.run(OpenAITarget(url).send("u", single(spec, ignore_eos=True, seed=5)))
    finally:
        server.shutdown()
    assert seen["path"] == "/v1/completions"
    body = seen["body"]
    assert body["prompt"].endswith("User: What is the capital of France?\nAssistant:")
    assert body["stream"] and body["ignore_eos"] and body["stop"] == [] and body["seed"] == 5
    assert r.ok and r.finish_reason == "length" and (r.prompt_tokens, r.output_tokens) == (12, 3)
    assert len(r.token_times) == 3 and r.ttft is not None and r.e2e >= r.ttft


# --- the conversation workload ------------------------------------------------------------------


class FakeOpenAI:
    """A minimal streaming /v1/completions endpoint, llama-server style: it answers turn k of a
    transcript with "reply <k>" and reports cached tokens as llama-server does (usage and/or
    timings), recording every request body."""

    def __init__(self, usage_details: bool = True) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        fake = self
        self.bodies: list[dict] = []
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                import json

                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.bodies.append(body)
                k = body["prompt"].count("User:")
                cached = 0 if body.get("cache_prompt") is False else 100 * (k - 1)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                usage = {"prompt_tokens": 100 * k, "completion_tokens": 2}
                if usage_details:
                    usage["prompt_tokens_details"] = {"cached_tokens": cached}
                chunks = [
                    {"choices": [{"text": t, "finish_reason": None}]} for t in (" reply", f" {k}")
                ]
                timings = {"cache_n": cached, "prompt_n": 100 * k - cached}
                final = {"text": "", "finish_reason": "stop"}
                chunks.append({"choices": [final], "usage": usage, "timings": timings})
                write_sse(self.wfile, chunks)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeOpenAI:
        import threading

        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("usage_details", [True, False])
def test_peer_conversations_resend_the_growing_history(usage_details):
    convs = build_conversations(2, 3, seed=2)
    with FakeOpenAI(usage_details) as fake:
        results, _ = asyncio.run(
            run_conversations(OpenAITarget(fake.url), convs, max_tokens=16, cold=True)
        )
    warmup, *turns = fake.bodies
    assert warmup["max_tokens"] == 8 and warmup["user"] == "warmup"
    assert len(turns) == 2 * (3 + 1)  # three turns and a cold replay per conversation
    for conv, out in zip(convs, results, strict=True):
        assert out.replies == [" reply 1", " reply 2", " reply 3"]
        assert [(r.ok, r.prompt_tokens, r.cached_tokens) for r in out.turns] == [
            (True, 100, 0),
            (True, 200, 100),
            (True, 300, 200),
        ]
        assert (out.cold.ok, out.cold.prompt_tokens, out.cold.cached_tokens) == (True, 300, 0)
        mine = [b for b in turns if conv.user_messages[0].strip() in b["prompt"]]
        assert len(mine) == 4
        for k, body in enumerate(mine[:3], start=1):
            assert body["temperature"] == 0.0 and body["max_tokens"] == 16 and body["stream"]
            assert body["prompt"].count("User:") == k and body["prompt"].endswith("Assistant:")
            assert body["prompt"].count("Assistant: reply") == k - 1
            assert "cache_prompt" not in body and "user" not in body  # the server's default
        assert mine[3]["prompt"] == mine[2]["prompt"] and mine[3]["cache_prompt"] is False


STAND_IN_LIMITS = {
    "max_frame_bytes": 1 << 20,
    "max_tokens": 4096,
    "max_inflight_per_user": 8,
    "max_queued_per_user": 16,
    "max_queued": 64,
}
STAND_IN_WELCOME = {"model": "fake", "n_ctx": 8192, "limits": STAND_IN_LIMITS, "version": "0"}


def stand_in_server(chats: list[tuple[str, dict]]):
    """A websocket handler speaking the protocol's frames: each chat gets " reply k", where k
    counts its user turns, and a usage that reports all but the last turn as cached (none for
    the `-cold` users)."""
    import json

    def frame(kind: str, **fields) -> str:
        return json.dumps({"type": kind, **fields})

    async def handler(ws):
        user = json.loads(await ws.recv())["user"]
        await ws.send(frame("welcome", protocol=1, **STAND_IN_WELCOME))
        async for raw in ws:
            chat = json.loads(raw)
            chats.append((user, chat))
            k = sum(m["role"] == "user" for m in chat["messages"])
            cached = 0 if user.endswith("-cold") else 100 * (k - 1)
            rid = chat["id"]
            await ws.send(frame("queued", id=rid, position=1))
            for text in (" reply", f" {k}"):
                await ws.send(frame("token", id=rid, text=text))
            usage = {"prompt_tokens": 100 * k, "completion_tokens": 2, "cached_tokens": cached}
            timings = {"queue_ms": 0.1, "ttft_ms": 1.0, "itl_ms": 1.0, "e2e_ms": 2.0}
            await ws.send(frame("done", id=rid, finish_reason="stop", usage=usage, timings=timings))

    return handler


def test_localserve_conversations_over_the_websocket_protocol():
    """The websocket path against a stand-in server speaking the protocol's frames."""
    from websockets.asyncio.server import serve

    chats: list[tuple[str, dict]] = []
    handler = stand_in_server(chats)

    async def main():
        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            convs = build_conversations(2, 3, seed=4)
            ws = WebSocketTarget(f"ws://127.0.0.1:{port}")
            return convs, await run_conversations(ws, convs, cold=True, concurrency=2)

    convs, (results, duration) = asyncio.run(main())
    assert duration > 0
    users = sorted({u for u, _ in chats})
    assert users == ["conv-0", "conv-0-cold", "conv-1", "conv-1-cold", "warmup"]
    for conv, out in zip(convs, results, strict=True):
        assert [(r.ok, r.prompt_tokens, r.cached_tokens) for r in out.turns] == [
            (True, 100, 0),
            (True, 200, 100),
            (True, 300, 200),
        ]
        assert out.cold.ok and out.cold.cached_tokens == 0 and out.cold.ttft is not None
        mine = [c for u, c in chats if u == out.user]
        assert [c["id"] for c in mine] == ["turn-1", "turn-2", "turn-3"]
        assert all(c["temperature"] == 0.0 and c["max_tokens"] == 64 for c in mine)
        last = mine[-1]["messages"]
        assert [m["role"] for m in last] == ["user", "assistant"] * 2 + ["user"]
        assert [m["content"] for m in last[1::2]] == [" reply 1", " reply 2"]
        assert [m["content"] for m in last[::2]] == list(conv.user_messages)
        cold = next(c for u, c in chats if u == f"{out.user}-cold")
        assert cold["messages"] == last


def test_bench_cli_runs_the_load_against_a_peer(tmp_path, capsys):
    import json

    from localserve.cli import main

    out = tmp_path / "load.json"
    with FakeOpenAI() as fake:
        args = ["bench", "--peer", fake.url, "--workload", "short", "--num-requests", "3"]
        rc = main([*args, "--concurrency", "2", "--ignore-eos", "--out", str(out)])
    assert rc == 0 and "completed 3, failed 0" in capsys.readouterr().out
    assert sorted(b["user"] for b in fake.bodies) == ["bench-0", "bench-1", "bench-2"]
    assert all(b["ignore_eos"] and b["stop"] == [] for b in fake.bodies)
    record = json.loads(out.read_text())
    assert record["summary"]["output_tokens"] == 6 and len(record["requests"]) == 3


def test_bench_cli_max_tokens_caps_single_workloads_and_conversations():
    from localserve.cli import build_parser, main

    p = build_parser()
    assert p.parse_args(["bench"]).max_tokens is None
    assert p.parse_args(["bench", "--workload", "chat", "--max-tokens", "96"]).max_tokens == 96
    with FakeOpenAI() as fake:
        args = ["bench", "--peer", fake.url, "--workload", "long", "--num-requests", "2"]
        assert main([*args, "--max-tokens", "5"]) == 0
    assert [b["max_tokens"] for b in fake.bodies] == [5, 5]
    with FakeOpenAI() as fake:
        args = ["bench", "--peer", fake.url, "--workload", "conversation", "--turns", "1"]
        assert main([*args, "--conversations", "1"]) == 0
    assert sorted(b["max_tokens"] for b in fake.bodies) == [8, 64]  # the warm-up's 8, a turn's 64


def test_bench_cli_writes_the_conversation_report(tmp_path, capsys):
    import json

    from localserve.cli import main

    out = tmp_path / "conv.json"
    with FakeOpenAI() as fake:
        rc = main(
            [
                "bench",
                "--peer",
                fake.url,
                "--workload",
                "conversation",
                "--conversations",
                "2",
                "--turns",
                "3",
                "--max-tokens",
                "8",
                "--cold",
                "--seed",
                "3",
                "--out",
                str(out),
            ]
        )
    assert rc == 0
    assert "turn 3 TTFT median" in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["server"] == "peer" and record["url"] == fake.url
    assert record["args"]["turns"] == 3 and record["args"]["cold"] is True
    summary = record["summary"]
    assert [row["turn"] for row in summary["turns"]] == [1, 2, 3]
    assert summary["turns"][2]["cached_tokens"]["mean"] == 200
    assert summary["cold"]["cached_tokens"]["mean"] == 0
    conv = record["conversations"][0]
    assert conv["replies"] == [" reply 1", " reply 2", " reply 3"]
    assert len(conv["user_messages"]) == 3 and conv["turns"][1]["cached_tokens"] == 100
    assert conv["cold"]["kind"] == "cold"
