"""The usage record through the server: one row per finished request, quotas that hold across
restarts and requests in flight, the access log, a server process killed or started on a bad
database, and a disk that fills up while serving. The store on its own is
unit/ops/test_usage.py."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from email.message import Message

import msgspec
import pytest

from localserve.bench.blocking_ws import WS
from localserve.bench.fake_server import FakeServer
from localserve.ops import usage_database
from localserve.ops.usage import Usage
from localserve.ops.usage_database import Row
from localserve.serve import routing as routing_module
from tests.support.cli import start_serve
from tests.support.live import configured
from tests.support.usage import rows_where
from tests.support.waiting import wait_until


def counted_tokens(usage: dict) -> int:
    """What a quota counts of a `done` frame's usage."""
    return usage["prompt_tokens"] - usage["cached_tokens"] + usage["completion_tokens"]


# --- through the server -------------------------------------------------------------------


def test_every_request_of_a_soak_has_its_row(tmp_path, monkeypatch):
    """200 requests from four clients, some cancelled, some over HTTP: the rows are the `done`
    frames, exactly."""
    monkeypatch.setattr(routing_module, "RECORD_WAIT_S", 30.0)  # committed, however busy the disk
    server = FakeServer(state_dir=str(tmp_path), step_s=0.001)
    dones: dict[str, dict] = {}
    lock = threading.Lock()

    def client(n: int) -> None:
        ws = WS(server.url)
        assert ws.hello(f"soak{n}")["type"] == "welcome"
        for i in range(45):
            rid = f"s{n}-{i}"
            ws.chat(rid, "one two three " * (i % 5 + 1), max_tokens=1 + i % 7)
            if i % 9 == 0:
                ws.send({"type": "cancel", "id": rid})
            frames = ws.until_done(rid)
            with lock:
                dones[rid] = frames[-1] | {"user": f"soak{n}"}
        ws.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for i in range(20):  # and over HTTP
        body = {"model": "fake", "user": "soak-http", "max_tokens": 3,
                "messages": [{"role": "user", "content": f"hello {i}"}]}  # fmt: skip
        request = urllib.request.Request(
            server.http + "/v1/chat/completions", json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            reply = json.load(response)
        dones[reply["id"]] = {"usage": reply["usage"], "user": "soak-http", "http": True}
    for t in threads:
        t.join(120)
    server.close()  # everything written
    db = usage_database.connect(tmp_path / usage_database.DATABASE, readonly=True)
    rows = {r.client_id: r for r in usage_database.rows_of(db)}
    assert len(rows) == len(dones) == 200
    assert any(d.get("finish_reason") == "cancelled" for d in dones.values())
    for rid, done in dones.items():
        r = rows[rid]
        assert r.user == done["user"]
        if done.get("http"):
            assert r.api == "http"
            assert r.prompt_tokens == done["usage"]["prompt_tokens"]
            assert r.completion_tokens == done["usage"]["completion_tokens"]
            continue
        assert r.api == "websocket" and r.finish_reason == done["finish_reason"]
        assert done["recorded"] is True
        u, t = done["usage"], done["timings"]
        assert (r.prompt_tokens, r.cached_tokens, r.completion_tokens) == (
            u["prompt_tokens"], u["cached_tokens"], u["completion_tokens"]
        )  # fmt: skip
        assert (r.queue_ms, r.ttft_ms, r.e2e_ms) == (t["queue_ms"], t["ttft_ms"], t["e2e_ms"])


def test_a_quota_is_enforced_and_holds_across_a_restart(tmp_path):
    config = dict(state_dir=str(tmp_path), daily_tokens_per_user={"quinn": 20})
    server = FakeServer(**config)
    try:
        ws = WS(server.url)
        welcome = ws.hello("quinn")
        assert welcome["quota"]["daily_tokens"] == 20 and welcome["quota"]["remaining"] == 20
        ws.chat("a", "one two three", max_tokens=30, ignore_eos=True)
        assert ws.until_done("a")[-1]["finish_reason"] == "length"
        ws.chat("b", "again")
        refused = ws.recv()
        assert refused["type"] == "error" and refused["code"] == "quota_exceeded"
        assert "resets at" in refused["message"] and refused["id"] == "b"
        assert 0 < refused["retry_after_s"] <= 25 * 3600  # until local midnight (a DST day: 25 h)
        other = WS(server.url)
        assert other.hello("rae")["quota"] is None  # no quota for others
        other.chat("c", "hello", max_tokens=2)
        assert other.until_done("c")[-1]["finish_reason"] in ("stop", "length")
    finally:
        server.close()
    server = FakeServer(**config)  # a restart
    try:
        ws = WS(server.url)
        assert ws.hello("quinn")["quota"]["remaining"] == 0
        ws.chat("d", "still?")
        assert ws.recv()["code"] == "quota_exceeded"
        body = {"model": "fake", "user": "quinn", "messages": [{"role": "user", "content": "hi"}]}
        request = urllib.request.Request(
            server.http + "/v1/chat/completions", json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        error = json.load(refused.value)["error"]
        assert refused.value.code == 429 and error["code"] == "insufficient_quota"
        wait = int(refused.value.headers["Retry-After"])
        reset = datetime.datetime.fromisoformat(error["message"].split("resets at ")[1][:25])
        assert abs(reset.timestamp() - time.time() - wait) < 5
    finally:
        server.close()


def test_the_access_log_has_a_line_per_request(tmp_path):
    log = tmp_path / "access.jsonl"
    server = FakeServer(state_dir=str(tmp_path), access_log=str(log), access_log_format="json")
    try:
        ws = WS(server.url)
        ws.hello("sam")
        for rid in ("x", "y"):
            ws.chat(rid, "hello there", max_tokens=3)
            ws.until_done(rid)
    finally:
        server.close()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(x["user"], x["client_id"]) for x in lines] == [("sam", "x"), ("sam", "y")]
    assert {"time", "model", "prompt_tokens", "ttft_ms", "finish_reason"} <= set(lines[0])
    plain = FakeServer(state_dir=str(tmp_path / "p"), access_log=str(tmp_path / "plain.log"))
    quiet = FakeServer(state_dir=str(tmp_path / "q"))  # loopback: off by default
    try:
        for s in (plain, quiet):
            ws = WS(s.url)
            ws.hello("sam")
            ws.chat("z", "hello", max_tokens=2)
            ws.until_done("z")
    finally:
        plain.close()
        quiet.close()
    [line] = (tmp_path / "plain.log").read_text().splitlines()
    assert '"sam"' in line and " websocket fake " in line and "prompt=" in line
    assert not list((tmp_path / "q").glob("access*"))


def test_monitors_see_todays_totals(tmp_path):
    server = FakeServer(state_dir=str(tmp_path), daily_tokens=1000)
    try:
        ws = WS(server.url)
        ws.hello("tess")
        ws.chat("a", "one two", max_tokens=3)
        ws.until_done("a")
        ws.send({"type": "subscribe", "interval_ms": 50})
        frame = wait_until(lambda: (f := ws.recv())["type"] == "stats" and f, 30)
        [tess] = frame["usage_today"]
        assert tess["user"] == "tess" and tess["requests"] == 1 and tess["daily_tokens"] == 1000
    finally:
        server.close()


# --- a real server process ----------------------------------------------------------------


def test_a_bad_database_stops_the_server_at_start_up(tmp_path):
    (tmp_path / usage_database.DATABASE).write_bytes(b"\0garbage" * 512)
    env = os.environ | {"LOCALSERVE_STATE_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "localserve", "serve", "--port", "0"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert "not a usable SQLite database" in done.stderr and str(tmp_path) in done.stderr


@pytest.mark.model
def test_a_killed_server_loses_no_finished_request(tmp_path):
    """SIGKILL in the middle of a soak, then a restart: every request whose `done` a client
    got before the kill, saying it was recorded, has its row."""
    proc, url = start_serve(tmp_path)
    got_done: list[str] = []
    lock = threading.Lock()

    def client(n: int) -> None:
        try:
            ws = WS(url)
            ws.hello(f"kill{n}")
            for i in range(1000):
                rid = f"k{n}-{i}"
                ws.chat(rid, f"Say something about {i}.", max_tokens=2 + i % 3)
                if ws.until_done(rid, timeout=60)[-1]["recorded"]:  # it says it has its row
                    with lock:
                        got_done.append(rid)
        except Exception:  # the server is gone: this client is done
            return

    clients = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(4)]
    for c in clients:
        c.start()
    try:
        wait_until(lambda: len(got_done) >= 80, 300, "80 replies")
    finally:  # a failed test must not leave its server running
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    for c in clients:
        c.join(30)
    with lock:
        done_before_kill = set(got_done)
    restarted, _ = start_serve(tmp_path)  # it starts again on the same database
    try:
        db = usage_database.connect(tmp_path / usage_database.DATABASE, readonly=True)
        recorded_ids = {r.client_id for r in usage_database.rows_of(db)}
        db.close()
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.wait(60)
    assert len(done_before_kill) >= 80
    assert done_before_kill <= recorded_ids, sorted(done_before_kill - recorded_ids)[:10]


def test_a_quota_caps_what_requests_in_flight_may_generate(tmp_path):
    """Eight requests at once against a quota of 50: together they use at most 50 tokens, their
    prompts included (held from admission on)."""
    server = FakeServer(state_dir=str(tmp_path), daily_tokens=50, step_s=0.005)
    try:
        ws = WS(server.url)
        ws.hello("uma")
        for i in range(8):
            ws.chat(f"p{i}", "one two", max_tokens=100, ignore_eos=True)
        frames = ws.until(lambda f: f["type"] == "error" or f["type"] == "done", 30)
        seen = frames[:]
        while sum(f["type"] in ("done", "error") for f in seen) < 8:
            seen.append(ws.recv(30))
        counted = sum(counted_tokens(f["usage"]) for f in seen if f["type"] == "done")
        refused = [f for f in seen if f["type"] == "error"]
        assert counted == 50 and refused and refused[0]["code"] == "quota_exceeded"
        assert "daily quota of 50 tokens is used up" in refused[0]["message"]
    finally:
        server.close()


def test_a_record_that_fails_never_holds_back_a_reply(tmp_path, monkeypatch):
    monkeypatch.setattr(routing_module, "RECORD_WAIT_S", 30.0)  # the good rows are committed
    server = FakeServer(state_dir=str(tmp_path))
    values = Row.values

    def broken(self):
        if self.client_id == "bad":
            raise TypeError("a value SQLite cannot take")
        return values(self)

    monkeypatch.setattr(Row, "values", broken)
    try:
        ws = WS(server.url)
        ws.hello("vic")
        for rid in ("good1", "bad", "good2"):
            ws.chat(rid, "hello", max_tokens=2)
        done = {}
        while len(done) < 3:  # every reply ends, the one whose record failed too
            frame = ws.recv(30)
            if frame["type"] == "done":
                done[frame["id"]] = frame["recorded"]
        assert done == {"good1": True, "bad": False, "good2": True}  # and says which
        ws.chat("after", "hello", max_tokens=2)
        assert ws.until_done("after")[-1]["recorded"] is True
        assert server.server.usage.problem == ""  # a bad row is not a broken record
    finally:
        server.close()
    db = usage_database.connect(tmp_path / usage_database.DATABASE, readonly=True)
    assert {r.client_id for r in usage_database.rows_of(db)} == {"good1", "good2", "after"}


def test_a_request_id_cannot_forge_access_log_lines(tmp_path):
    log = tmp_path / "access.log"
    server = FakeServer(state_dir=str(tmp_path), access_log=str(log))
    try:
        ws = WS(server.url)
        ws.hello("wes")
        forged = 'x\n2026-11-30T10:00:00.000+00:00 "bob" 9:y websocket fake stop prompt=1'
        ws.chat(forged, "hello", max_tokens=2)
        ws.until_done(forged)
    finally:
        server.close()
    [line] = log.read_text().splitlines()
    assert '"wes"' in line and "\\n" in line


# --- when the record cannot be written ------------------------------------------------------


def test_quota_reservations_return_to_zero_on_every_path(tmp_path):
    """Done, cancelled, refused for its prompt, too long: what each request held of the quota
    (its prompt and its max_tokens) is given back, and what it used is counted."""
    server = FakeServer(state_dir=str(tmp_path), daily_tokens=1000, step_s=0.005, n_ctx=2048)
    store = server.server.usage

    def held() -> int:  # released on the loop before the `done` goes
        return store.quotas._reserved.get("zed", 0)

    try:
        ws = WS(server.url)
        ws.hello("zed")
        ws.chat("done", "one two three", max_tokens=5)
        used = counted_tokens(ws.until_done("done")[-1]["usage"])
        assert held() == 0
        ws.chat("cancel", "one two three", max_tokens=200, ignore_eos=True)
        ws.until(lambda f: f["type"] == "token")
        ws.send({"type": "cancel", "id": "cancel"})
        used += counted_tokens(ws.until_done("cancel")[-1]["usage"])
        assert held() == 0
        ws.chat("long", "word " * 990, max_tokens=5)  # fits the context, not what is left
        refused = ws.recv()
        assert refused["code"] == "quota_exceeded" and "does not fit" in refused["message"]
        assert held() == 0
        ws.chat("huge", "word " * 2100)  # over the context
        assert ws.recv()["code"] == "too_long" and held() == 0
        assert store.quotas.quota("zed").used_today == used
    finally:
        server.close()


def post(server, body: dict) -> tuple[int, Message, str]:
    """POST /v1/chat/completions: the status, the headers and the body's text."""
    body = {"model": "fake", "messages": [{"role": "user", "content": "hello"}]} | body
    request = urllib.request.Request(
        server.http + "/v1/chat/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def test_http_replies_say_when_their_row_is_not_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(routing_module, "RECORD_WAIT_S", 0.2)
    server = FakeServer(state_dir=str(tmp_path), daily_tokens_per_user={"quinn": 1000})
    store = server.server.usage
    is_failing = threading.Event()
    is_failing.set()
    insert = store._insert

    def failing(rows):
        if is_failing.is_set():
            raise sqlite3.OperationalError("disk I/O error")
        return insert(rows)

    monkeypatch.setattr(store, "_insert", failing)
    try:
        status, _, text = post(server, {"user": "rae", "max_tokens": 3})
        assert status == 200 and json.loads(text)["recorded"] is False
        status, _, text = post(server, {"user": "rae", "max_tokens": 3, "stream": True})
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["recorded"] is False
        assert all("recorded" not in json.loads(e) for e in events[:-2])
        wait_until(lambda: store.problem, 30, "the record known broken")  # the writer tried
        status, headers, text = post(server, {"user": "quinn", "max_tokens": 3})
        assert status == 503 and int(headers["Retry-After"]) > 0
        assert (
            "usage record cannot be written (cannot write" in json.loads(text)["error"]["message"]
        )
        is_failing.clear()
        wait_until(lambda: store.problem == "", 30, "written again")
        assert len(usage_database.rows_of(store.db)) == 2  # the kept rows, on disk now
        status, _, text = post(server, {"user": "quinn", "max_tokens": 3})
        assert status == 200 and "recorded" not in json.loads(text)
    finally:
        server.close()


# --- on the real server ---------------------------------------------------------------------


@contextlib.contextmanager
def usage_of(live, **config):
    """The live server records into a Usage of its own meanwhile (its state dir, its quotas)."""
    server = live.server
    store = Usage(msgspec.structs.replace(server.config, **config), server.model_name)
    old, server.usage = server.usage, store
    try:
        yield store
    finally:
        live.wait_idle()
        wait_until(lambda: server.router.num_unsent_dones == 0, 30, "every `done` sent")
        server.usage = old
        store.close()


def frames_within(ws: WS, seconds: float) -> list[dict]:
    """Whatever the server sends in the next `seconds`."""
    frames, end = [], time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        try:
            frames.append(ws.recv(left))
        except TimeoutError:
            break
    return frames


def healthz(live) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(live.http + "/healthz", timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


@pytest.mark.model
def test_no_done_arrives_before_its_row_is_committed(live, connect, monkeypatch):
    """The writer held: the reply's tokens come, its `done` does not; the moment it comes, the
    row is in the database. Held past RECORD_WAIT_S, the `done` says it is not recorded."""
    store = live.server.usage
    gate = threading.Event()
    insert = store._insert

    def held(rows):
        gate.wait(60)
        return insert(rows)

    monkeypatch.setattr(store, "_insert", held)
    monkeypatch.setattr(routing_module, "RECORD_WAIT_S", 30.0)  # not past it while held
    try:
        ws = connect()
        ws.hello("yan")
        ws.chat("held", "Say hello.", max_tokens=4)
        wait_until(lambda: live.server.router.num_unsent_dones == 1, 60, "the reply generated")
        assert "done" not in {f["type"] for f in frames_within(ws, 1.5)}
        gate.set()
        done = ws.until_done("held")[-1]
        assert rows_where(store, "held"), "a `done` before its row was committed"
        assert done["recorded"] is True

        monkeypatch.setattr(routing_module, "RECORD_WAIT_S", 0.5)
        gate.clear()
        ws.chat("late", "Say hello.", max_tokens=4)
        done = ws.until_done("late")[-1]
        assert done["recorded"] is False and not rows_where(store, "late")
        gate.set()
        wait_until(lambda: rows_where(store, "late"), 30, "the row written after all")
    finally:
        gate.set()


@pytest.mark.model
def test_a_full_disk_while_serving(live, connect, small_disk, monkeypatch):
    """The state directory fills up while serving: `done`s say they are not recorded, /healthz
    and the stats frame say why, chats under a quota are refused; once there is room the kept
    rows are written, and the quota counts survive a restart."""
    monkeypatch.setattr(routing_module, "RECORD_WAIT_S", 30.0)  # committed, however busy
    quotas = {"tara": 100_000}
    with usage_of(live, state_dir=str(small_disk.path), daily_tokens_per_user=quotas) as store:
        tara = connect()
        assert tara.hello("tara")["quota"]["remaining"] == 100_000
        tara.chat("a", "Say one word.", max_tokens=3)
        dones = [tara.until_done("a")[-1]]
        assert dones[0]["recorded"] is True and rows_where(store, "a")
        small_disk.fill()
        monkeypatch.setattr(routing_module, "RECORD_WAIT_S", 1.0)  # its row cannot be written
        tara.chat("b", "Say two words.", max_tokens=3)
        dones.append(tara.until_done("b")[-1])
        assert dones[1]["recorded"] is False and not rows_where(store, "b")
        monkeypatch.setattr(routing_module, "RECORD_WAIT_S", 30.0)

        status, health = healthz(live)
        assert status == 503 and health["ok"] is False
        assert "database or disk is full" in health["usage_problem"]
        assert health["usage_unwritten"] == 1
        monitor = connect()
        monitor.hello("mona")
        monitor.send({"type": "subscribe", "interval_ms": 50})
        stats = monitor.until(lambda f: f["type"] == "stats")[-1]
        assert "database or disk is full" in stats["usage_problem"]

        tara.chat("c", "Again?", max_tokens=3)
        refused = tara.recv()
        assert (refused["type"], refused["code"], refused["id"]) == ("error", "unavailable", "c")
        assert "usage record cannot be written" in refused["message"]
        uri = connect()  # no quota: served, and told at once that it is not recorded
        uri.hello("uri")
        uri.chat("u", "Say one word.", max_tokens=3)
        assert uri.until_done("u")[-1]["recorded"] is False

        small_disk.free()
        wait_until(lambda: store.problem == "", 30, "writable again")
        assert rows_where(store, "b") and rows_where(store, "u")
        assert healthz(live)[0] == 200
        stats = monitor.until(lambda f: f["type"] == "stats" and not f["usage_problem"])[-1]
        tara.chat("d", "Say one word.", max_tokens=3)
        dones.append(tara.until_done("d")[-1])
        assert dones[2]["recorded"] is True and rows_where(store, "d")
        used = sum(counted_tokens(d["usage"]) for d in dones)
        assert store.quotas.quota("tara").used_today == used
    again = Usage(store.config, "gemma")  # a restart on the same directory
    assert again.quotas.quota("tara").used_today == used
    again.close()


@pytest.mark.model
def test_parallel_long_prompts_stay_within_a_quota(live, connect, tmp_path):
    """Eight ~800-token prompts at once against a quota of 3,000: the prompts count from
    admission on, so together they use at most the quota and one reply's max_tokens."""
    max_tokens, text = 32, "The quick brown fox jumps over the lazy dog. " * 80
    limits = dict(max_inflight_per_user=8, max_queued_per_user=8)
    quota = dict(state_dir=str(tmp_path), daily_tokens_per_user={"pia": 3000})
    with configured(live, **limits), usage_of(live, **quota) as store:
        ws = connect()
        ws.hello("pia")
        for i in range(8):
            ws.chat(f"p{i}", f"Request {i}. {text}", max_tokens=max_tokens, ignore_eos=True)
        ends: dict[str, dict] = {}
        while len(ends) < 8:
            frame = ws.recv(120)
            if frame["type"] in ("done", "error"):
                ends[frame["id"]] = frame
        dones = [f for f in ends.values() if f["type"] == "done"]
        refused = [f for f in ends.values() if f["type"] == "error"]
        assert len(dones) >= 2 and all(700 < d["usage"]["prompt_tokens"] < 1000 for d in dones)
        used = sum(counted_tokens(d["usage"]) for d in dones)
        assert used <= 3000 + max_tokens, f"{used} tokens against a quota of 3000"
        assert refused and {f["code"] for f in refused} == {"quota_exceeded"}
        assert store.quotas.quota("pia").used_today == used and store.quotas._reserved == {}
