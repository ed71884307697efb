"""What an embedding flood costs a streaming user, against chat pastes of as many tokens
(issue 51, finding 1).

One server on the embedded model (in this process, the engine in its own), default settings.
bob streams greedy 30-token replies one after another (each reply's start is where a flood
used to hurt: `--reply-tokens`); in turn, for `--seconds` each and
`--rounds` times:

  pastes  three clients, each in a loop, send a chat whose prompt is 32 paragraphs of 60 words
          (max_tokens 1): as many prompt tokens as one embedding request;
  embeds  three clients, each in a loop, POST /v1/embeddings with 32 inputs of 60 words.

Prints a markdown row per kind: bob's gaps between tokens (p50, p99, the longest, how many over
0.8 s and over 1 s; the wait before each reply's first token counts as a gap), and the
tokens/s the three clients got computed (prompt tokens for pastes, embedded tokens for
embeds); then the same loads' tokens/s alone, with no stream beside them. Run on a quiet
machine:

    .venv/bin/python benchmarks/embedding_stall.py [--seconds 10] [--rounds 2]

Figures: docs/benchmarks.md, "An embedding flood beside a stream (issue 51)".
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TEXT = (
    "the quick brown fox jumps over a lazy dog near the river bank while birds sing softly in "
    "tall green trees and children play games on warm summer evenings"
)
WORDS = TEXT.split(" ")
PARAGRAPH = " ".join(WORDS[i % len(WORDS)] for i in range(60))
INPUTS = [f"{i}: {PARAGRAPH}" for i in range(32)]


def post(url: str, path: str, body: dict) -> dict:
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=300)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    reply = json.loads(c.getresponse().read())
    c.close()
    return reply


def load(url: str, kind: str, user: str, stop: threading.Event, done: list[int]) -> None:
    while not stop.is_set():
        if kind == "embeds":
            r = post(
                url, "/v1/embeddings", {"model": "gemma-3-270m", "input": INPUTS, "user": user}
            )
        else:  # a new paste each time: no cached prefix
            messages = [{"role": "user", "content": f"{time.time()}\n\n" + "\n\n".join(INPUTS)}]
            r = post(
                url,
                "/v1/chat/completions",
                {"model": "gemma-3-270m", "user": user, "messages": messages, "max_tokens": 1},
            )
        done.append(r.get("usage", {}).get("prompt_tokens", 0))


def phase_tokens(url: str, kind: str, seconds: float, phase: dict | None = None) -> int:
    """Tokens/s three clients get computed in `seconds` of `kind`; `phase["kind"]` names it
    while they run (bob's gaps are counted under it), else nobody else is there."""
    stop, done = threading.Event(), []
    clients = [
        threading.Thread(target=load, args=(url, kind, f"u{i}", stop, done)) for i in range(3)
    ]
    start = time.monotonic()
    for c in clients:
        c.start()
    if phase is not None:
        phase["kind"] = kind
    time.sleep(seconds)
    if phase is not None:
        phase["kind"] = None
    stop.set()
    for c in clients:
        c.join(300)
    return int(sum(done) / (time.monotonic() - start))


def stream(ws, reply_tokens: int, phase: dict, gaps: dict, stop: threading.Event) -> None:
    """bob: replies one after another, the gaps between his tokens counted under the phase
    running (across replies: a reply's late start is a gap too)."""
    n, last = 0, None
    while not stop.is_set():
        n += 1
        ws.chat(f"b{n}", "Tell me about the sea.", max_tokens=reply_tokens, ignore_eos=True)
        while (f := ws.recv(300))["type"] != "done":
            if f["type"] == "token":
                now = time.monotonic()
                if last is not None and phase["kind"]:
                    gaps[phase["kind"]].append(now - last)
                last = now


def report(gaps: dict, tokens: dict, alone: dict, rounds: int) -> None:
    print("| beside | bob's gaps | p50 | p99 | longest | over 0.8 s | over 1 s | tokens/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for kind, g in gaps.items():
        q = statistics.quantiles(g, n=100)
        print(
            f"| {kind} | {len(g)} | {statistics.median(g) * 1e3:.0f} ms | {q[98] * 1e3:.0f} ms "
            f"| {max(g):.2f} s | {sum(x > 0.8 for x in g)} | {sum(x > 1 for x in g)} "
            f"| {tokens[kind] // rounds} |"
        )
    print(
        f"\nalone (no stream beside them): prompt tokens/s {alone['pastes']}, "
        f"embedded tokens/s {alone['embeds']}"
    )


def main() -> None:
    import tempfile

    from localserve.bench.blocking_ws import WS
    from localserve.config import builtin_config
    from localserve.serve.serving import serving

    args = argparse.ArgumentParser()
    args.add_argument("--seconds", type=float, default=10.0)
    args.add_argument("--rounds", type=int, default=2)
    args.add_argument("--reply-tokens", type=int, default=30, help="bob's replies (default 30)")
    a = args.parse_args()
    gaps: dict[str, list[float]] = {"pastes": [], "embeds": []}
    tokens: dict[str, int] = {"pastes": 0, "embeds": 0}
    config = builtin_config()  # the embedded model, default settings
    config.server.state_dir = tempfile.mkdtemp(prefix="embedding-stall-")
    config.server.max_frame_bytes = 1 << 20
    with serving(config, thread=True) as served:
        url = served.thread.http
        bob = WS(served.thread.url)
        bob.hello("bob")
        phase: dict = {"kind": None}
        stop_bob = threading.Event()
        streamer = threading.Thread(
            target=stream, args=(bob, a.reply_tokens, phase, gaps, stop_bob), daemon=True
        )
        streamer.start()
        time.sleep(2)
        for _ in range(a.rounds):
            for kind in ("pastes", "embeds"):
                tokens[kind] += phase_tokens(url, kind, a.seconds, phase)
        stop_bob.set()
        streamer.join(300)
        alone = {kind: phase_tokens(url, kind, a.seconds) for kind in ("pastes", "embeds")}
    report(gaps, tokens, alone, a.rounds)


if __name__ == "__main__":
    main()
