"""What one hostile user costs everyone else (issue 10): bob's stream, quiet and under attack.

Starts `localserve serve` (the embedded model, default settings) as its own process, then
measures bob, who streams greedy 64-token replies one after another, in each scenario for the
same number of replies, alternating the scenarios twice:

  quiet    bob alone;
  flood    four connections that never read send 60 KB frames that each earn an error, then
           small ones, reconnecting whenever the server drops them;
  sponge   a connection that asks for eight 1,500-token replies and never reads, reconnecting
           whenever the server drops it;
  fuzz     a user sending chats with hostile sampling values (temperature 1e-320, which used
           to fail the whole step, denormal top_p, huge top_k, ...), reading its replies;
  busy4    for comparison, an ordinary user with four replies at a time (default sampling);
  topk0    the same with top_k 0 and min_p 0 (every draw used to sort all 262,144 tokens);
  pings    a connection that sends pings as fast as it can and never reads a pong;
  pastes   four connections pasting 250 KB prompts (far over the context) back to back.

Run on a quiet machine (`--server-tree DIR` serves from another checkout, for the figures
before a change):

    .venv/bin/python benchmarks/hostile_user.py [--replies 12] [--server-tree DIR]

Prints one markdown table, a row per scenario: bob's replies whole (all must be), his TTFT p50,
ITL p50 and p99, his longest gap, the server's resident memory growth, and how many attacking
connections the server dropped; the same as JSON to --out (bench-results/hostile_user.json).
Figures: docs/benchmarks.md, "One hostile user: what everyone else feels (issue 10)".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from localserve.bench.hostile import RawClient  # noqa: E402

PORT = 8799
SEA = [{"role": "user", "content": "Tell me about the sea."}]
HI = [{"role": "user", "content": "Hi"}]
URL = f"ws://127.0.0.1:{PORT}"


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(x for x in f if x.startswith("VmRSS:")).split()[1]) * 1024


def bob(n_replies: int) -> dict:
    """n greedy replies of 64 tokens in a row; token arrival times per reply."""
    ttfts, gaps, whole = [], [], 0
    with connect(URL, max_size=None) as ws:
        ws.send(json.dumps({"type": "hello", "user": "bob"}))
        json.loads(ws.recv())
        for i in range(n_replies):
            start = time.monotonic()
            chat = {"type": "chat", "id": f"b{i}", "max_tokens": 64, "ignore_eos": True,
                    "temperature": 0, "messages": SEA}  # fmt: skip
            ws.send(json.dumps(chat))
            last = None
            while True:
                frame = json.loads(ws.recv(300))
                now = time.monotonic()
                if frame["type"] == "token":
                    if last is None:
                        ttfts.append(now - start)
                    else:
                        gaps.append(now - last)
                    last = now
                elif frame["type"] == "done":
                    whole += frame["finish_reason"] == "length" and (
                        frame["usage"]["completion_tokens"] == 64
                    )
                    break
    return {"ttfts": ttfts, "gaps": gaps, "whole": whole}


def flood(stop: threading.Event, drops: list[int]) -> None:
    big = json.dumps({"type": "chat", "id": "x", "k" * 60_000: 1})
    small = json.dumps({"type": "cancel", "id": "n" * 128})
    while not stop.is_set():
        client = RawClient(URL)
        client.send({"type": "hello", "user": "flood"})
        n = 0
        while not stop.is_set() and client.send(big if n < 300 else small):
            n += 1
        client.close()
        drops[0] += not stop.is_set()


def sponge(stop: threading.Event, drops: list[int]) -> None:
    messages = [{"role": "user", "content": "Write a long story."}]
    while not stop.is_set():
        client = RawClient(URL)
        client.send({"type": "hello", "user": "sponge"})
        for i in range(8):
            client.send({"type": "chat", "id": f"c{i}", "max_tokens": 1500, "ignore_eos": True,
                         "messages": messages})  # fmt: skip
        while not stop.is_set() and client.send({"type": "cancel", "id": "nothing-yet"}):
            time.sleep(0.5)  # keeps poking: a send fails once the server has dropped it
        client.close()
        drops[0] += not stop.is_set()


HOSTILE = [{"temperature": 1e-320}, {"temperature": 5e-324, "top_p": 5e-324},
           {"top_k": 2147483647, "min_p": 1.0}, {"temperature": 100, "top_k": 0, "top_p": 1},
           {"repeat_penalty": 0.01, "temperature": 1e-5}, {"top_k": 10**40}]  # fmt: skip


def fuzz(stop: threading.Event, drops: list[int]) -> None:
    with connect(URL, max_size=None) as ws:
        ws.send(json.dumps({"type": "hello", "user": "fuzz"}))
        json.loads(ws.recv())
        i = 0
        while not stop.is_set():
            i += 1
            fields = HOSTILE[i % len(HOSTILE)]
            ws.send(json.dumps({"type": "chat", "id": f"f{i}", "max_tokens": 16,
                                "messages": HI} | fields))  # fmt: skip
            while json.loads(ws.recv(300))["type"] not in ("done", "error"):
                pass


def four_at_a_time(stop: threading.Event, sampling: dict) -> None:
    chat = {"max_tokens": 48, "ignore_eos": True, "messages": SEA} | sampling
    with connect(URL, max_size=None) as ws:
        ws.send(json.dumps({"type": "hello", "user": "four"}))
        json.loads(ws.recv())
        for i in range(4):
            ws.send(json.dumps({"type": "chat", "id": f"w{i}"} | chat))
        n = 4
        while not stop.is_set():
            if json.loads(ws.recv(300))["type"] == "done":
                n += 1
                ws.send(json.dumps({"type": "chat", "id": f"w{n}"} | chat))


def busy4(stop: threading.Event, drops: list[int]) -> None:
    four_at_a_time(stop, {"temperature": 1.0})


def topk0(stop: threading.Event, drops: list[int]) -> None:
    four_at_a_time(stop, {"temperature": 1.0, "top_k": 0, "min_p": 0, "top_p": 0.99})


def pings(stop: threading.Event, drops: list[int]) -> None:
    while not stop.is_set():
        client = RawClient(URL)
        client.send({"type": "hello", "user": "pinger"})
        while not stop.is_set() and client.send("x" * 125, opcode=0x9):
            pass
        client.close()
        drops[0] += not stop.is_set()


def pastes(stop: threading.Event, drops: list[int]) -> None:
    def paste(k: int) -> None:
        text = [{"role": "user", "content": "word " * 50_000}]
        with connect(URL, max_size=None) as ws:
            ws.send(json.dumps({"type": "hello", "user": f"paste{k}"}))
            json.loads(ws.recv())
            i = 0
            while not stop.is_set():
                i += 1
                ws.send(json.dumps({"type": "chat", "id": f"p{i}", "messages": text}))
                json.loads(ws.recv(300))  # too_long

    threads = [threading.Thread(target=paste, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


ATTACKS = {"quiet": None, "flood": flood, "sponge": sponge, "fuzz": fuzz, "busy4": busy4,
           "topk0": topk0, "pings": pings, "pastes": pastes}  # fmt: skip


def measure(pid: int, name: str, n_replies: int) -> dict:
    stop, drops = threading.Event(), [0]
    before, peak = rss(pid), [rss(pid)]
    attack = ATTACKS[name]
    thread = threading.Thread(target=attack, args=(stop, drops), daemon=True) if attack else None
    if thread:
        thread.start()
        time.sleep(2)  # let it take hold
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            peak.append(rss(pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    result = bob(n_replies)
    stop.set()
    sampling.set()
    if thread:
        thread.join(30)
    sampler.join()
    return result | {"rss_growth": max(peak) - before, "drops": drops[0]}


def percentile(xs: list[float], q: int) -> float:
    """The q-th percentile (q = 50: the median); NaN with fewer than two values."""
    return statistics.quantiles(xs, n=100)[q - 1] if len(xs) > 1 else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replies", type=int, default=12, help="bob's replies per scenario run")
    parser.add_argument("--out", default="bench-results/hostile_user.json")
    parser.add_argument("--server-tree", help="serve from this checkout (e.g. an older commit)")
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent
    env = os.environ | ({"PYTHONPATH": args.server_tree} if args.server_tree else {})
    server = subprocess.Popen([str(root / ".venv/bin/python"), "-m", "localserve", "serve",
                               "--port", str(PORT)], cwd=args.server_tree or root, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        bob(2)  # warm-up
        runs: dict[str, list[dict]] = {name: [] for name in ATTACKS}
        for _ in range(2):
            for name in ATTACKS:
                runs[name].append(measure(server.pid, name, args.replies))
                print(f"{name}: done", file=sys.stderr, flush=True)
    finally:
        server.terminate()
        server.wait(60)
    print("| scenario | bob's replies whole | TTFT p50 | ITL p50 | ITL p99 | longest gap | "
          "server RSS growth | attackers dropped |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    summary = {}
    for name, results in runs.items():
        ttfts = [t for r in results for t in r["ttfts"]]
        gaps = [g for r in results for g in r["gaps"]]
        row = {
            "whole": f"{sum(r['whole'] for r in results)}/{2 * args.replies}",
            "ttft_p50_ms": 1e3 * percentile(ttfts, 50),
            "itl_p50_ms": 1e3 * percentile(gaps, 50),
            "itl_p99_ms": 1e3 * percentile(gaps, 99),
            "max_gap_ms": 1e3 * max(gaps, default=float("nan")),
            "rss_growth_mib": max(r["rss_growth"] for r in results) / 2**20,
            "drops": sum(r["drops"] for r in results),
        }
        summary[name] = row
        print(f"| {name} | {row['whole']} | {row['ttft_p50_ms']:.0f} ms | "
              f"{row['itl_p50_ms']:.1f} ms | {row['itl_p99_ms']:.1f} ms | "
              f"{row['max_gap_ms']:.0f} ms | {row['rss_growth_mib']:.1f} MiB | "
              f"{row['drops']} |")  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
