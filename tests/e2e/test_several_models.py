"""Several models on one server (localserve/serve/pool.py), on the real engine: the embedded
GGUF under two names with different settings ("gemma", the default, and "small", a smaller
n_ctx), plus two that cannot load (a missing file, a truncated copy of the GGUF). Alternating
requests of several users to both complete; with max_loaded_models = 1 they swap and every
request completes, a busy model is never evicted mid-reply (the newcomer waits, `loading`,
saying why); with room for both, both stay loaded; a broken model fails only its own requests;
after keep_alive the engine process is gone and the next request loads it again. A cancel while
a chat's model loads ends it at once (its connection reads on meanwhile), and an HTTP client that
leaves while its model loads frees its place at once."""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from localserve.bench.blocking_ws import WS
from localserve.config import Config, ModelConfig, ServerConfig
from tests.support.waiting import wait_until

pytestmark = pytest.mark.model  # the embedded model, under two names

SETTINGS = dict(
    chat_format="transcript", chat_template="gemma", max_num_batched_tokens=256, n_threads=2
)


def models_config(tmp_path, **server) -> Config:
    from localserve.runners.models import ensure_embedded

    gguf = ensure_embedded()
    truncated = tmp_path / "truncated.gguf"
    with open(gguf, "rb") as src, open(truncated, "wb") as dst:
        dst.write(src.read(4 << 20))  # the header and a little of the weights
    models = {
        "gemma": ModelConfig(embedded=True, n_ctx=2048, max_num_seqs=4, **SETTINGS),
        "small": ModelConfig(path=str(gguf), n_ctx=1024, max_num_seqs=2, **SETTINGS),
        "missing": ModelConfig(path=str(tmp_path / "no-such.gguf"), **SETTINGS),
        "truncated": ModelConfig(path=str(truncated), **SETTINGS),
    }
    limits = dict(shutdown_grace_s=2, usage=True, state_dir=str(tmp_path)) | server
    return Config(default="gemma", models=models, server=ServerConfig(**limits))


@pytest.fixture
def serve(tmp_path):
    from localserve.serve.serving import serving

    opened = []

    def start(**server):
        opened.append(serving(models_config(tmp_path, **server), thread=True))
        return opened[-1].__enter__()

    yield start
    for cm in reversed(opened):
        cm.__exit__(None, None, None)


def chat(served, model: str, user: str, max_tokens: int = 8, **extra) -> tuple[int, dict]:
    body = {
        "model": model,
        "user": user,
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": f"Hello from {user}"}],
    } | extra
    request = urllib.request.Request(
        served.thread.http + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(served, path: str) -> dict:
    with urllib.request.urlopen(served.thread.http + path, timeout=30) as response:
        return json.loads(response.read())


def states(served) -> dict[str, str]:
    return {m["name"]: m["state"] for m in get(served, "/healthz")["models"]}


def test_alternating_requests_of_several_users_to_both_models_complete(serve):
    served = serve()
    assert states(served) == {
        "gemma": "loaded",
        "small": "unloaded",
        "missing": "unloaded",
        "truncated": "unloaded",
    }
    results, threads = [], []
    for user in ("ann", "bob", "cy"):
        for i in range(4):
            model = ("gemma", "small")[i % 2]
            target = lambda u=user, m=model: results.append((m, chat(served, m, u)))  # noqa: E731
            threads.append(threading.Thread(target=target))
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert len(results) == 12
    for model, (status, body) in results:
        assert status == 200, body
        assert body["model"] == model and body["choices"][0]["message"]["content"]
    assert states(served)["small"] == "loaded" and states(served)["gemma"] == "loaded"
    cards = {c["id"]: c for c in get(served, "/v1/models")["data"]}
    assert cards["small"]["max_model_len"] == 1024 and cards["gemma"]["max_model_len"] == 2048
    assert cards["small"]["status"] == "loaded" and cards["missing"]["status"] == "unloaded"
    usage = served.server.usage  # one record for every model: each row names its model
    wait_until(lambda: _rows(usage.path) == 12, 30, "every row written")
    with sqlite3.connect(usage.path) as db:
        per_model = dict(db.execute("SELECT model, count(*) FROM requests GROUP BY model"))
        users = {u for (u,) in db.execute("SELECT DISTINCT user FROM requests")}
    assert per_model == {"gemma": 6, "small": 6} and users == {"ann", "bob", "cy"}
    # the Ollama and Anthropic APIs pick the model by name too, and list them all
    ollama = {"model": "small:latest", "stream": False, "options": {"num_predict": 4},
              "messages": [{"role": "user", "content": "Hi"}]}  # fmt: skip
    assert post(served, "/api/chat", ollama)["model"] == "small:latest"
    tags = [m["name"] for m in get(served, "/api/tags")["models"]]
    assert tags == ["gemma:latest", "small:latest", "missing:latest", "truncated:latest"]
    anthropic = {"model": "small", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    assert post(served, "/v1/messages", anthropic)["model"] == "small"
    counted = post(served, "/v1/messages/count_tokens", anthropic | {"model": "gemma"})
    assert counted["input_tokens"] > 0


def _rows(path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT count(*) FROM requests").fetchone()[0]


def test_with_room_for_one_they_swap_and_a_busy_model_finishes_its_reply(serve):
    served = serve(max_loaded_models=1)
    ws = WS(served.thread.url)
    ws.hello("ann")
    ws.chat("long", "Tell me a long story", max_tokens=120, ignore_eos=True)  # gemma, busy
    ws.until(lambda f: f["type"] == "token")
    ws.chat("other", "Hi", model="small", max_tokens=4)
    frames = ws.until_done("long", 180)
    loading = [f for f in frames if f["type"] == "queued" and f.get("loading")]
    assert any("waiting for memory: gemma is busy" in f["loading"] for f in loading), frames
    long_done = frames[-1]
    assert long_done["finish_reason"] == "length" and long_done["usage"]["completion_tokens"] == 120
    done = ws.until_done("other", 180)[-1]
    assert done["finish_reason"] in ("stop", "length"), done
    assert done["timings"]["load_ms"] > 0
    assert done["timings"]["ttft_ms"] >= done["timings"]["load_ms"]
    assert states(served)["gemma"] == "unloaded" and states(served)["small"] == "loaded"
    ws.close()
    for model in ("gemma", "small", "gemma"):  # swapped each time, every request completes
        status, body = chat(served, model, "bob")
        assert status == 200, body
        loaded = [n for n, s in states(served).items() if s == "loaded"]
        assert loaded == [model]


def test_a_model_that_cannot_load_fails_only_its_own_requests(serve):
    served = serve()
    for name, why in (("missing", "no-such.gguf"), ("truncated", "")):
        status, body = chat(served, name, "ann")
        assert status == 503, body
        message = body["error"]["message"]
        assert message.startswith(f"model {name} could not be loaded: ") and why in message
        assert states(served)[name] == "failed"
        status, body = chat(served, name, "ann")  # again at once: the same answer, no new load
        assert status == 503 and "could not be loaded" in body["error"]["message"]
    status, body = chat(served, "gemma", "bob")
    assert status == 200, body
    status, body = chat(served, "nonesuch", "bob")
    assert status == 404 and "'gemma', 'small', 'missing', 'truncated'" in body["error"]["message"]
    ws = WS(served.thread.url)
    welcome = ws.hello("cy")
    assert welcome["models"] == ["gemma", "small", "missing", "truncated"]
    ws.chat("m", "Hi", model="missing", max_tokens=4)
    error = ws.until(lambda f: f["type"] == "error")[-1]
    assert (
        error["code"] == "unavailable" and "model missing could not be loaded" in error["message"]
    )
    ws.close()


def test_after_keep_alive_the_engine_process_is_gone_and_the_next_request_loads_it(serve):
    served = serve()
    pool = served.server.pool
    small = pool.slot("small")
    small.model.keep_alive = 1  # as models.toml's keep_alive = 1 would
    before = rss_mib(os.getpid())  # the server's process (this one): gemma loaded
    status, body = chat(served, "small", "ann")
    assert status == 200, body
    pid = small.engine._process.pid
    assert rss_mib(pid) > 100  # the engine process holds the model
    os.kill(pid, 0)  # the engine process is there
    tags = {m["name"]: m for m in get(served, "/api/ps")["models"]}
    assert "small:latest" in tags and tags["small:latest"]["expires_at"] < "2300"
    wait_until(lambda: small.state == "unloaded", 30, "small unloaded after its keep_alive")

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(gone, 60, "the engine process exited")
    # its vocabulary closed (after the process) and the heap trimmed: the memory is back
    wait_until(lambda: rss_mib(os.getpid()) < before + 24, 30, f"RSS back near {before:.0f} MiB")
    assert "small:latest" not in {m["name"] for m in get(served, "/api/ps")["models"]}
    status, body = chat(served, "small", "ann")
    assert status == 200, body
    assert small.is_loaded and small.engine._process.pid != pid
    # Ollama's idiom: an empty generate with keep_alive 0 unloads it, one without loads it
    assert post(served, "/api/generate", {"model": "small", "keep_alive": 0})["done_reason"] == (
        "unload"
    )
    wait_until(lambda: small.state == "unloaded", 30, "small unloaded by keep_alive 0")
    assert post(served, "/api/generate", {"model": "small:latest"})["done_reason"] == "load"
    assert small.is_loaded


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def post(served, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        served.thread.http + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_a_cancel_while_its_model_loads_ends_it_at_once_and_the_connection_reads_on(serve):
    served = serve()
    small, admission = served.server.pool.slot("small"), served.server.admission
    ws = WS(served.thread.url)
    ws.hello("ann")
    ws.chat("slow", "Tell me a story", model="small", max_tokens=60)
    loading = ws.until(lambda f: f["type"] == "queued")[-1]
    assert loading["id"] == "slow" and loading["loading"] == "loading model small"
    ws.chat("slow", "Again", model="small")  # its id is taken while it is being admitted
    refused = ws.until(lambda f: f["type"] == "error")[-1]
    assert refused["id"] == "slow" and "already in flight" in refused["message"]
    ws.chat("quick", "Hi", max_tokens=4)  # the default model, answered meanwhile
    quick = ws.until(lambda f: f["type"] == "queued" and f["id"] == "quick")[-1]
    assert "loading" not in quick and small.state == "loading"
    ws.send({"type": "cancel", "id": "slow"})
    frames = ws.until_done("slow", 30)
    cancelled_at = time.time()
    done = frames[-1]
    assert done["finish_reason"] == "cancelled" and done["usage"]["completion_tokens"] == 0
    assert done["recorded"] is True and done["timings"]["load_ms"] > 0  # a row, as others'
    assert not [f for f in frames if f["type"] in ("token", "error") and f.get("id") == "slow"]
    assert ws.until_done("quick", 60)[-1]["finish_reason"] in ("stop", "length")
    wait_until(lambda: small.is_loaded, 60, "the load goes on for whoever comes next")
    assert cancelled_at < small.since  # its done came before the load ended
    assert small.active == 0 and admission.counts.inflight_per_user == {}
    assert admission.counts.waiting == 0 and not admission.requests
    ws.chat("slow", "Hi", model="small", max_tokens=4)  # the id is free again; small answers
    assert ws.until_done("slow", 60)[-1]["finish_reason"] in ("stop", "length")
    ws.close()


def test_an_http_client_gone_while_its_model_loads_frees_its_place_at_once(serve):
    served = serve()
    small, admission = served.server.pool.slot("small"), served.server.admission
    host, port = urllib.parse.urlsplit(served.thread.http).netloc.split(":")
    body = json.dumps({"model": "small", "stream": True, "max_tokens": 60, "user": "ann",
                       "messages": [{"role": "user", "content": "Hi"}]}).encode()  # fmt: skip
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    client = socket.create_connection((host, int(port)), timeout=30)
    client.sendall(head + body)
    wait_until(lambda: any(r.loading for r in list(admission.requests.values())), 30, "loading")
    assert small.active == 1 and admission.counts.inflight_per_user == {"ann": 1}
    client.close()
    wait_until(lambda: not admission.requests, 30, "the request gone with its client")
    gone_at = time.time()
    assert admission.counts.waiting == 0 and admission.counts.inflight_per_user == {}
    assert small.active == 0 and small.state == "loading"  # the pool slot no longer held
    wait_until(lambda: small.is_loaded, 60, "the load ends")
    assert gone_at < small.since and small.active == 0 and small.expires is not None  # idle
    status, reply = chat(served, "small", "ann")  # and it serves the next one
    assert status == 200, reply


def test_a_swap_has_its_turn_while_another_user_keeps_the_loaded_model_busy(serve):
    """max_loaded_models = 1: alice keeps two chats going on gemma, one after another without a
    pause; bob asks for small once. Once bob waits, gemma takes no new request (they wait for
    their turn, told why), drains what it runs, and small loads: no request of alice's that
    began after bob's is answered before bob's first token. Then alice's waiting requests have
    their turn: gemma comes back and every request of hers is answered."""
    served = serve(max_loaded_models=1)
    stop, log = threading.Event(), []  # (start, end, status) of each of alice's requests

    def alice():
        while not stop.is_set():
            start = time.monotonic()
            status, _ = chat(served, "gemma", "alice", max_tokens=16, ignore_eos=True)
            log.append((start, time.monotonic(), status))

    chats = [threading.Thread(target=alice) for _ in range(2)]
    for t in chats:
        t.start()
    wait_until(lambda: len(log) >= 2, 120, "alice's chats under way")
    ws = WS(served.thread.url)
    ws.hello("bob")
    asked = time.monotonic()
    ws.chat("b", "Hi", model="small", max_tokens=4)
    frames = ws.until(lambda f: f["type"] in ("token", "done") and f["id"] == "b", 180)
    first_token = time.monotonic()
    assert frames[-1]["type"] == "token", frames[-1]
    overtaking = [(s, e) for s, e, _ in log if s > asked and e < first_token]
    assert not overtaking, f"{len(overtaking)} of alice's later requests went first"
    ws.until_done("b", 60)
    ws.close()
    gemma = served.server.pool.slot("gemma")
    wait_until(lambda: gemma.is_loaded and len(log) >= 8, 180, "alice's turn comes back")
    stop.set()
    for t in chats:
        t.join(180)
    assert {status for _, _, status in log} == {200}, log


def test_serve_says_each_load_swap_unload_and_failed_load_on_its_console(tmp_path):
    """`localserve serve` as a person runs it: its console (stderr) has one line per model
    event, with its time (serve/pool.py's lines, shown at INFO by cli/__init__.py)."""
    import subprocess
    import sys

    from localserve.runners.models import ensure_embedded
    from tests.support.cli import kill_serve
    from tests.support.paths import ROOT

    (tmp_path / "broken.gguf").write_bytes(b"not a GGUF at all")
    (tmp_path / "models.toml").write_text(
        'default = "gemma"\n[server]\nmax_loaded_models = 1\n'
        f'[models.gemma]\npath = "{ensure_embedded()}"\nchat_format = "transcript"\n'
        f'[models.small]\npath = "{ensure_embedded()}"\nchat_format = "transcript"\n'
        'n_ctx = 1024\nkeep_alive = "1s"\n'
        '[models.broken]\npath = "broken.gguf"\nchat_format = "transcript"\n'
    )
    command = [sys.executable, "-m", "localserve", "serve", "--port", "0"]
    env = os.environ | {"PYTHONPATH": str(ROOT), "LOCALSERVE_STATE_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    out: list[str] = []
    lines: list[str] = []  # the console's stderr
    threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True).start()
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()

    def said(words: str) -> bool:
        return any(words in line for line in lines)

    try:
        url = wait_until(
            lambda: next((f"http://{m[1]}" for x in out if (m := PORT.search(x))), None), 180
        )

        class Served:  # what chat() reads of a served model
            thread = type("Thread", (), {"http": url})

        assert chat(Served, "small", "ann")[0] == 200  # gemma swapped out for small
        wait_until(lambda: said("model small unloaded after 1 s idle"), 60)
        assert chat(Served, "broken", "ann")[0] != 200
        wait_until(lambda: said("model broken could not be loaded"), 60)
    finally:
        kill_serve(proc)
    pool = [
        x.split("localserve.serve.pool: ", 1)[1].rstrip("\n") for x in lines if "serve.pool" in x
    ]
    events = [x for x in pool if not x.startswith("loading model")]
    patterns = [
        r"swap: unloading gemma to load small \(max_loaded_models = 1\)",
        r"model gemma unloaded for small \(\d+\.\d s\)",
        r"model small loaded in \d+\.\d s \(\d[\d,]* MiB\)",
        r"model small unloaded after 1 s idle \(\d+\.\d s\)",
        r"model broken could not be loaded after \d+\.\d s: .+",
    ]
    assert len(events) == len(patterns), lines
    for line, pattern in zip(events, patterns, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern, lines)


PORT = re.compile(r"on ws://(127\.0\.0\.1:\d+)")


def test_the_monitor_shows_the_second_models_engine_and_its_reply_live(serve):
    """A subscribe names the model whose engine the stats show (one the server lacks: a
    bad_request naming its models, the stream going on); one never loaded shows the default's
    figures until it loads. The monitor's m switches its panels to the next model: a reply from
    the second model shows in its running table, live, "panels: small" on the header at 120
    columns."""
    import asyncio

    from tests.support.monitor import header_text
    from tests.support.waiting import async_wait_until
    from tui.monitor import MonitorApp
    from tui.source import WebSocketSource
    from tui.widgets.requests import RunningTable

    served = serve()
    ws = WS(served.thread.url)
    ws.send({"type": "subscribe", "interval_ms": 100, "model": "small"})  # not loaded yet
    assert ws.until(lambda f: f["type"] == "stats")[-1]["snapshot"]["model"]["model"] == "gemma"
    ws.send({"type": "subscribe", "interval_ms": 100, "model": "nope"})
    error = ws.until(lambda f: f["type"] == "error")[-1]
    assert error["code"] == "bad_request" and "'gemma', 'small'" in error["message"], error
    assert ws.until(lambda f: f["type"] == "stats")[-1]["snapshot"]["model"]["model"] == "gemma"
    ws.close()

    async def run():
        app = MonitorApp(WebSocketSource(served.thread.url, interval_ms=100), "ws://test")
        async with app.run_test(size=(120, 40)) as pilot:
            pause = lambda: pilot.pause(0.05)  # noqa: E731
            await async_wait_until(lambda: len(app.models) == 4, 30, "the models", pause)
            assert "panels: gemma" in header_text(app)
            await pilot.press("m")  # the next model: small, not loaded yet
            await async_wait_until(
                lambda: "panels: gemma (small not loaded)" in header_text(app), 30, "", pause
            )
            ws = WS(served.thread.url)
            ws.hello("ann")
            ws.chat("story", "Tell me a story.", model="small", max_tokens=400, ignore_eos=True)
            table = app.query_one(RunningTable)
            await async_wait_until(lambda: table.row_count, 60, "small's reply", pause)
            line = header_text(app).splitlines()[0]
            assert "panels: small · models: gemma idle, small busy" in line, line
            assert "ann" in str(table.get_row_at(0)[0])
            await pilot.press("m")  # and on: missing, never loaded: the default's figures
            await async_wait_until(
                lambda: "panels: gemma (missing not loaded)" in header_text(app), 30, "", pause
            )
            assert table.row_count == 0  # gemma runs nothing
            ws.send({"type": "cancel", "id": "story"})
            ws.until_done("story")
            ws.close()

    asyncio.run(run())


def test_one_person_flipping_models_does_not_make_the_others_wait_for_loads(tmp_path, monkeypatch):
    """max_loaded_models = 1, loads of 1 s (paced fake runners): bob asks "first" again and
    again, his median TTFT alone the control. Then ann flips between the two models as fast as
    her replies come while bob goes on: his median TTFT stays within twice his own (each flip
    used to cost his next request a load: 0.2-0.8 s became 7-21 s on the real models), and
    ann, past her swaps, is told why she waits."""
    import statistics

    from tests.support.fakes import two_fake_models

    def ttft(ws: WS, rid: str, model: str) -> float:
        start = time.monotonic()
        ws.chat(rid, "Hi", model=model, max_tokens=4)
        ws.until(lambda f: f["type"] in ("token", "done") and f.get("id") == rid, 60)
        took = time.monotonic() - start
        ws.until_done(rid, 60)
        return took

    with two_fake_models(tmp_path, monkeypatch, load_s=1.0) as served:
        bob = WS(served.thread.url)
        bob.hello("bob")
        alone = [ttft(bob, f"a{i}", "first") for i in range(6)]
        stop, told = threading.Event(), []

        def flip() -> None:
            ann = WS(served.thread.url)
            ann.hello("ann")
            for i in range(1000):
                if stop.is_set():
                    break
                ann.chat(f"f{i}", "Hi", model=("second", "first")[i % 2], max_tokens=4)
                frames = ann.until(lambda f: f["type"] == "done" or stop.is_set(), 120)
                told.extend(f.get("loading", "") for f in frames if f["type"] == "queued")
            ann.close()

        flipper = threading.Thread(target=flip, daemon=True)
        flipper.start()
        beside = [ttft(bob, f"b{i}", "first") for i in range(10)]
        stop.set()
        bob.close()
    flipper.join(30)
    ratio = statistics.median(beside) / statistics.median(alone)
    assert statistics.median(beside) <= 2 * statistics.median(alone) + 0.2, (alone, beside, ratio)
    assert any("waiting: model first is serving others for" in why for why in told), told
