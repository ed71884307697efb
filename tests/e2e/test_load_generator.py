"""The load generator: workloads, targets, runs and reports (statistics on synthetic timings,
arrival processes, stand-in servers, one smoke run against the real one)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import statistics

import numpy as np
import pytest

from localserve.bench.report import (
    SLO,
    format_conversations,
    summarize,
    summarize_conversations,
)
from localserve.bench.runs import ConversationResult, run_conversations, run_load, single
from localserve.bench.targets import OpenAITarget, RequestResult, WebSocketTarget, target
from localserve.bench.workloads import (
    FIRST_PART,
    NEXT_PART,
    RequestSpec,
    arrival_times,
    build_conversations,
    build_requests,
    estimate_prompt_tokens,
    turn_messages,
)
from localserve.engine.stats import percentile


def result(sent: float, gaps: list[float], ttft: float, ok: bool = True, tokens=None):
    """A request sent at `sent`, first token after `ttft`, then token frames `gaps` apart."""
    times = [sent + ttft]
    for gap in gaps:
        times.append(times[-1] + gap)
    n = tokens if tokens is not None else len(times)
    return RequestResult(
        "short",
        ok=ok,
        error="" if ok else "busy",
        prompt_tokens=10,
        output_tokens=n if ok else 0,
        sent=sent,
        token_times=times if ok else [],
        done=times[-1],
    )


def test_request_timings_follow_vllm_definitions():
    r = result(sent=10.0, gaps=[0.1, 0.2, 0.3], ttft=0.5)
    assert r.ttft == pytest.approx(0.5)
    assert r.e2e == pytest.approx(0.5 + 0.6)
    assert r.tpot == pytest.approx(0.6 / 3)  # (e2e - ttft) / (n - 1)
    assert r.itls == pytest.approx([0.1, 0.2, 0.3])


def test_coalesced_frames_make_tpot_differ_from_itl():
    # 4 tokens arrived in 2 frames: ITL sees one gap, TPOT spreads it over 3 tokens
    r = result(sent=0.0, gaps=[0.3], ttft=0.2, tokens=4)
    assert r.itls == pytest.approx([0.3]) and r.tpot == pytest.approx(0.1)


def test_summary_counts_throughput_and_percentiles():
    results = [
        result(0.0, [0.1] * 9, 0.2),
        result(0.0, [0.1] * 4, 0.4),
        result(0.0, [], 0.1, ok=False),
    ]
    s = summarize(results, duration_s=2.0)
    assert s["completed"] == 2 and s["failed"] == 1 and s["errors"] == {"busy": 1}
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_token_throughput"] == pytest.approx((10 + 5) / 2.0)
    assert s["total_token_throughput"] == pytest.approx((10 + 5 + 20) / 2.0)
    assert s["ttft_ms"]["mean"] == pytest.approx(300.0)
    assert s["ttft_ms"]["median"] == pytest.approx(300.0)
    assert s["itl_ms"]["median"] == pytest.approx(100.0)
    assert s["e2e_ms"]["p99"] == pytest.approx(percentile([1100.0, 800.0], 99))


def test_goodput_counts_requests_meeting_every_slo():
    fast = result(0.0, [0.05] * 4, 0.2)
    slow_start = result(0.0, [0.05] * 4, 2.0)
    slow_tokens = result(0.0, [0.5] * 4, 0.2)
    failed = result(0.0, [], 0.1, ok=False)
    slo = SLO.parse("ttft=1000,tpot=100")
    assert [slo.met(r) for r in (fast, slow_start, slow_tokens, failed)] == [
        True,
        False,
        False,
        False,
    ]
    s = summarize([fast, slow_start, slow_tokens, failed], duration_s=4.0, slo=slo)
    assert s["good_requests"] == 1 and s["goodput"] == pytest.approx(0.25)


def test_bad_slo_text_is_a_clear_error():
    with pytest.raises(ValueError, match="ttft=MS"):
        SLO.parse("latency=5")


def test_poisson_arrivals_have_the_asked_rate():
    times = arrival_times(4000, rate=5.0, seed=1)
    gaps = np.diff(times)
    assert times[0] == 0.0
    assert statistics.mean(gaps) == pytest.approx(0.2, rel=0.05)
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, rel=0.1)


def test_burstiness_below_one_makes_arrivals_burstier():
    smooth = np.diff(arrival_times(4000, rate=5.0, burstiness=4.0, seed=2))
    bursty = np.diff(arrival_times(4000, rate=5.0, burstiness=0.25, seed=2))
    for gaps in (smooth, bursty):
        assert gaps.mean() == pytest.approx(0.2, rel=0.1)  # same rate
    cv = lambda g: g.std() / g.mean()  # noqa: E731
    assert cv(smooth) == pytest.approx(0.5, rel=0.1)  # 1 / sqrt(shape)
    assert cv(bursty) == pytest.approx(2.0, rel=0.1)


def test_infinite_rate_sends_everything_at_once():
    assert arrival_times(5, rate=math.inf) == [0.0] * 5


def test_workloads_are_reproducible_and_mixed():
    a, b = build_requests("mixed", 200, seed=3), build_requests("mixed", 200, seed=3)
    assert a == b and a != build_requests("mixed", 200, seed=4)
    kinds = [r.kind for r in a]
    assert {"short", "long", "paste"} == set(kinds)
    assert 0.35 < kinds.count("short") / 200 < 0.65
    paste = next(r for r in a if r.kind == "paste")
    assert len(paste.prompt.split()) > 1500


def test_max_tokens_sets_every_requests_output_length():
    default = build_requests("mixed", 50, seed=2)
    capped = build_requests("mixed", 50, seed=2, max_tokens=96)
    assert {r.max_tokens for r in default} == {48, 320, 96}
    assert all(r.max_tokens == 96 for r in capped)
    assert [(r.kind, r.prompt) for r in capped] == [(r.kind, r.prompt) for r in default]
    with pytest.raises(ValueError, match="--max-tokens"):
        build_requests("short", 3, max_tokens=0)


def test_unknown_workload_is_refused():
    with pytest.raises(ValueError, match="--workload"):
        build_requests("everything", 3)


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


def test_the_url_names_the_target_and_the_endpoint_shapes_the_body():
    assert isinstance(target("ws://127.0.0.1:8765"), WebSocketTarget)
    chat_peer = target("http://127.0.0.1:8080", openai=True, endpoint="chat")
    assert isinstance(chat_peer, OpenAITarget) and chat_peer.path == "/v1/chat/completions"
    assert target("http://127.0.0.1:8080", openai=True).path == "/v1/completions"
    with pytest.raises(ValueError, match="--endpoint"):
        OpenAITarget("http://127.0.0.1:8080", "embeddings")
    request = single(RequestSpec("short", "Hi?", 4), ignore_eos=False, seed=1)
    body = chat_peer.body(request)
    assert body["messages"] == [{"role": "user", "content": "Hi?"}] and "prompt" not in body
    assert body["temperature"] == 0.7 and body["stream_options"] == {"include_usage": True}
    completion = OpenAITarget("http://x").body(dataclasses.replace(request, reuse=False))
    assert completion["prompt"].endswith("User: Hi?\nAssistant:") and completion["stop"]
    assert completion["cache_prompt"] is False and "messages" not in completion


def sweep_point(policy, workload, c, tps, ttft_p99, itl_p99):
    dist = lambda p99: {"mean": p99 / 2, "median": p99 / 2, "p90": p99, "p99": p99}  # noqa: E731
    return {
        "policy": policy,
        "workload": workload,
        "concurrency": c,
        "completed": 4,
        "failed": 0,
        "request_throughput": c / 4,
        "output_token_throughput": tps,
        "ttft_ms": dist(ttft_p99),
        "itl_ms": dist(itl_p99),
        "tpot_ms": dist(itl_p99),
        "e2e_ms": dist(ttft_p99 * 3),
    }


def test_sweep_writes_json_markdown_and_an_svg_chart(tmp_path):
    import json
    import xml.etree.ElementTree as ET

    from localserve.bench.sweep import write_results

    points = [
        sweep_point(pol, "chat", c, tps * c, 100 * c, 20 + c)
        for pol, tps in (("continuous", 40), ("static", 25))
        for c in (1, 2, 4)
    ]
    out = write_results(points, tmp_path)
    assert json.loads((out / "sweep.json").read_text()) == points
    table = (out / "sweep.md").read_text().splitlines()
    assert len(table) == 2 + len(points) and "| continuous | chat | 4 |" in table[4]
    svg = ET.parse(out / "sweep.svg").getroot()
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 4  # two series in each of the two panels


# --- the conversation workload ------------------------------------------------------------------


def test_conversations_are_reproducible_and_read_the_text_part_by_part():
    a, b = build_conversations(3, 5, seed=7), build_conversations(3, 5, seed=7)
    assert a == b and a != build_conversations(3, 5, seed=8)
    for conv in a:
        assert len(conv.user_messages) == 5
        assert conv.user_messages[0].startswith(FIRST_PART)
        assert all(m.startswith(NEXT_PART) for m in conv.user_messages[1:])
        # each part is ~350 tokens of the document (the intro and the question aside)
        assert all(280 < len(m.split()) < 340 for m in conv.user_messages)
    with pytest.raises(ValueError, match="--turns"):
        build_conversations(2, 0)


def test_history_grows_to_about_2000_tokens_by_turn_5_and_each_prompt_extends_the_last():
    from localserve.serve.prompt import render_transcript

    reply = " ".join(["word"] * 40)  # a ~50-token reply
    for conv in build_conversations(4, 5, seed=1):
        replies = [f"{reply} {k}" for k in range(5)]
        sizes, previous = [], ""
        for turn in range(1, 6):
            messages = turn_messages(conv, replies, turn)
            assert len(messages) == 2 * turn - 1 and messages[-1][0] == "user"
            assert [m for r, m in messages if r == "assistant"] == replies[: turn - 1]
            text = render_transcript(messages)
            assert text.startswith(previous)  # the last turn's prompt is a prefix: reusable
            previous = text
            sizes.append(estimate_prompt_tokens(messages))
        assert all(b - a > 350 for a, b in zip(sizes, sizes[1:], strict=False))
        assert 1800 < sizes[-1] < 2300
    with pytest.raises(ValueError, match="turn 3 needs 2 replies"):
        turn_messages(conv, ["one"], 3)


def turn(ttft: float, prompt: int, cached: int, ok: bool = True, kind: str = "turn"):
    r = result(0.0, [0.05] * 3, ttft, ok=ok)
    r.kind, r.prompt_tokens, r.cached_tokens = kind, prompt, cached
    return r


def test_report_aggregates_per_turn_with_the_cold_replay_and_the_ratio():
    a = ConversationResult(
        0,
        "conv-0",
        [turn(1.0, 400, 0), turn(0.2, 800, 390)],
        ["x", "y"],
        cold=turn(2.0, 800, 0, kind="cold"),
    )
    b = ConversationResult(
        1,
        "conv-1",
        [turn(1.2, 410, 0), turn(0.4, 820, 400)],
        ["x", "y"],
        cold=turn(3.0, 820, 0, kind="cold"),
    )
    c = ConversationResult(2, "conv-2", [turn(1.1, 420, 0, ok=False)], [""])
    s = summarize_conversations([a, b, c], duration_s=9.0)
    assert s["conversations"] == 3 and s["completed"] == 2
    one, two = s["turns"]
    assert one["turn"] == 1 and one["completed"] == 2 and one["failed"] == 1
    assert one["errors"] == {"busy": 1}
    assert two["completed"] == 2 and two["failed"] == 1 and two["errors"] == {"not_reached": 1}
    assert one["ttft_ms"]["mean"] == pytest.approx(1100.0)
    assert two["ttft_ms"]["median"] == pytest.approx(300.0)
    assert two["ttft_ms"]["p90"] == pytest.approx(380.0)
    assert two["prompt_tokens"] == {"mean": 810.0, "min": 800, "max": 820}
    assert two["cached_tokens"]["mean"] == pytest.approx(395.0)
    assert two["cached_share"] == pytest.approx(790 / 1620)
    cold = s["cold"]
    assert cold["turn"] == "cold" and cold["completed"] == 2 and cold["cached_tokens"]["max"] == 0
    last = s["last_turn"]
    assert last["turn"] == 2 and last["ttft_median_ms"] == pytest.approx(300.0)
    assert last["ratio_to_cold"] == pytest.approx(300.0 / 2500.0)
    table = format_conversations(s)
    assert "turn 2 TTFT median 300 ms, cold 2500 ms: 12%" in table
    assert " cold  2/2 " in table and "{'not_reached': 1}" in table
    # without a cold replay: no ratio
    assert summarize_conversations([a, b], 1.0)["last_turn"]["ratio_to_cold"] is not None
    a.cold = b.cold = None
    s = summarize_conversations([a, b], 1.0)
    assert s["cold"] is None and s["last_turn"]["ratio_to_cold"] is None


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


def test_no_prefix_cache_turns_prefix_caching_off():
    from localserve.cli import build_parser
    from localserve.cli.shared import prefix_cache_option
    from localserve.config import Config

    config = Config()
    assert config.scheduler.prefix_caching
    off = prefix_cache_option(config, True)
    assert off.scheduler.prefix_caching is False and config.scheduler.prefix_caching
    assert prefix_cache_option(config, False) is config
    assert build_parser().parse_args(["serve", "--no-prefix-cache"]).no_prefix_cache
    assert not build_parser().parse_args(["serve"]).no_prefix_cache
