"""Do people taking turns in long conversations ever pay a full prefill again? (issue 48)

The client of benchmarks/prefix_cache_tiers.sh, which starts the servers and says how to run
the whole benchmark. It speaks the OpenAI-compatible streaming API that localserve and
llama-server both serve (`/v1/chat/completions`, `/v1/completions` for the ITL case's stream),
and measures on the client: TTFT is the time from sending a request to its first non-empty
content chunk.

- `rotation`: N people, each one conversation whose first turn is a ~1,450-token slice of
  localserve/bench/data/pages.md (a different slice per person) and a question; then R rounds in
  rotation, one request at a time: person 1's next turn (the whole history, their replies as
  streamed, a ~20-token question), person 2's, ... Every turn is followed at once by the same
  person's follow-up, the "warm" control: its prefix is certainly still in the KV cells. Greedy,
  32 tokens at most. Each person is a distinct `user` (localserve keeps prefixes per user); on
  llama-server each person is just a conversation of its own. `--phase first` runs round 1 and
  saves the conversations, `--phase resume` the rounds after it (the restart case).
- `itl`: one stream of 200 tokens, alone, then while 8 people whose conversations have left
  the cells (fillers took them) resume theirs beside it, then alone again: its gaps between
  chunks against itl_target_ms.
- `models-toml`: models.toml with n_ctx and, with `--no-tiers`, host_cache_mib = 0 and
  disk_cache_mib = 0 (the old behaviour), wherever localserve.config defines those keys.
- `report DIR`: the tables and the goals of the JSON files in DIR, as markdown.

Each run's JSON has every turn (round, kind cold|resumed|warm, prompt and cached tokens as the
server reports them: `usage.prompt_tokens_details.cached_tokens`, else llama-server's
`timings.cache_n`), the server's RSS (the process and its children, after each round) and, for
localserve, its /metrics series about prefixes, tiers and restores after each round.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import re
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import httpx

PAGES = Path(__file__).resolve().parent.parent / "localserve/bench/data/pages.md"
METRIC = re.compile(r"^localserve:\S*(prefix|host|disk|restore)\S*\s")
FIRST_QUESTION = "Which three points in these notes matter most to a new baker? Answer briefly."
QUESTIONS = [
    "Thank you. What would you tell a friend about this, in a single short sentence?",
    "Good. Which of those points costs the most money, and why, in one sentence?",
    "And which of them would you do first if you opened a bakery next month?",
    "What is the one mistake these notes warn about most clearly? One sentence, please.",
]
FOLLOW_UPS = [
    "Can you say that again in fewer words?",
    "Is there anything you would add to that answer?",
    "Which word in your answer matters most?",
    "Would a large bakery agree with that?",
]
STREAM_PROMPT = (
    "Here is a long story about a baker, her oven and the town she fed. Once upon a time,"
)


# --- the texts ---------------------------------------------------------------------------------


@functools.cache
def first_turns(num_people: int, words: int) -> list[str]:
    """Each person's first message: a slice of pages.md (its own starting paragraph, read on
    cyclically) of about `words` words, then the question."""
    paras = [p.strip() for p in PAGES.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    texts = []
    for i in range(num_people):
        start, taken, n = (i * len(paras)) // max(num_people, 1), [], 0
        while n < words:
            para = paras[(start + len(taken)) % len(paras)]
            taken.append(para)
            n += len(para.split())
        body = " ".join(" ".join(taken).split()[:words])
        # one line: a blank line inside a message makes the base model end its reply at once
        texts.append(f"Here is a document I am reading, copy {i + 1}: {body}\n\n{FIRST_QUESTION}")
    return texts


# --- one request -------------------------------------------------------------------------------


def client_for(url: str) -> httpx.Client:
    """A client that opens a connection per request: llama-server closes one after a streamed
    reply without saying so, and the next request on it fails ("Server disconnected")."""
    return httpx.Client(base_url=url, timeout=600, limits=httpx.Limits(max_keepalive_connections=0))


def stream(client: httpx.Client, path: str, body: dict) -> dict:
    """POST a streaming request; the reply's text, TTFT, each content chunk's arrival (s after
    sending) and the usage the server reported."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0}
    sent_at = t0 = time.perf_counter()
    text, arrivals, usage, timings, finish = [], [], None, None, None
    with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{path}: HTTP {r.status_code}: {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta", {}).get("content") or choice.get("text") or ""
                if delta:
                    text.append(delta)
                    arrivals.append(time.perf_counter() - t0)
                finish = choice.get("finish_reason") or finish
    total = time.perf_counter() - t0
    return {
        "text": "".join(text),
        "sent_at": sent_at,
        "ttft_ms": 1000 * (arrivals[0] if arrivals else total),
        "total_ms": 1000 * total,
        "is_empty": not arrivals,
        "arrivals_s": arrivals,
        "finish_reason": finish,
        **_counts(usage, timings),
    }


def _counts(usage: dict | None, timings: dict | None) -> dict:
    """Prompt, cached and completion tokens: the usage chunk's, else llama-server's timings."""
    usage, timings = usage or {}, timings or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None:
        cached = timings.get("cache_n")
    prompt = usage.get("prompt_tokens")
    if prompt is None and "prompt_n" in timings:
        prompt = timings["prompt_n"] + timings.get("cache_n", 0)
    return {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": usage.get("completion_tokens", timings.get("predicted_n")),
    }


def chat_turn(client: httpx.Client, messages: list, user: str, question: str, max_tokens: int):
    """One turn of a conversation: asks `question`, adds it and the reply to `messages`."""
    messages.append({"role": "user", "content": question})
    result = stream(
        client,
        "/v1/chat/completions",
        {"messages": messages, "user": user, "max_tokens": max_tokens},
    )
    messages.append({"role": "assistant", "content": result["text"]})
    return result


# --- the server's side: RSS, /metrics, the disk tier ------------------------------------------


def rss_kib(pid: int | None) -> dict:
    """RSS of `pid` and its descendants, in KiB: each process's and the total."""
    if not pid:
        return {}
    ps = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,rss=,comm="], capture_output=True, text=True)
    rows = [line.split(None, 3) for line in ps.stdout.splitlines()]
    procs = {int(r[0]): (int(r[1]), int(r[2]), r[3] if len(r) > 3 else "") for r in rows}
    tree, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        if p in procs:
            tree.append(p)
            frontier += [c for c, (parent, _, _) in procs.items() if parent == p]
    each = {f"{p} {procs[p][2]}": procs[p][1] for p in tree}
    return {"total": sum(each.values()), "processes": each}


def prefix_metrics(url: str) -> dict:
    """localserve's /metrics series about prefixes, tiers and restores ({} for llama-server)."""
    try:  # a connection of its own: llama-server's pooled one broke after its /metrics
        text = httpx.get(f"{url}/metrics", timeout=30).text
    except httpx.HTTPError:
        return {}
    found = {}
    for line in text.splitlines():
        if METRIC.match(line):
            name, value = line.rsplit(None, 1)
            found[name] = float(value)
    return found


def dir_bytes(path: str | None) -> int | None:
    """Bytes of the files under `path` (the disk tier), None when there is no such directory."""
    if not path or not Path(path).is_dir():
        return None
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def snapshot(args, label: str) -> dict:
    """The server's state after a phase: RSS, prefix metrics, the disk tier's size."""
    return {
        "label": label,
        "rss_kib": rss_kib(args.pid),
        "metrics": prefix_metrics(args.url),
        "disk_tier_bytes": dir_bytes(args.disk_dir),
    }


# --- the rotation ------------------------------------------------------------------------------


def rotation(args) -> None:
    """Round 1 (first turns), then the resumed rounds, each turn followed by a warm one."""
    out = Path(args.out)
    run = json.loads(out.read_text()) if args.phase == "resume" and out.exists() else None
    run = run or {"args": vars(args), "turns": [], "snapshots": []}
    conversations = _conversations(args)
    rounds = {"all": range(1, args.rounds + 2), "first": [1], "resume": range(2, args.rounds + 2)}
    with client_for(args.url) as client:
        if args.phase == "resume":
            run["snapshots"].append(snapshot(args, "after the restart"))
        for r in rounds[args.phase]:
            for i, messages in enumerate(conversations):
                run["turns"] += _person_round(client, args, i, r, messages)
            run["snapshots"].append(snapshot(args, f"after round {r}"))
            _print_round(run["turns"], r)
            out.write_text(json.dumps(run, indent=1))
    if args.conversations:
        Path(args.conversations).write_text(json.dumps(conversations))


def _conversations(args) -> list[list]:
    if args.phase == "resume":
        return json.loads(Path(args.conversations).read_text())
    return [[] for _ in range(args.people)]


def _person_round(client, args, i: int, r: int, messages: list) -> list[dict]:
    """Person i's turn in round r and their warm follow-up."""
    user = f"person-{i + 1:02d}"
    if r == 1:
        question, kind = first_turns(args.people, args.words)[i], "cold"
    else:
        question, kind = QUESTIONS[(i + r) % len(QUESTIONS)], "resumed"
    turns = []
    for q, k in ((question, kind), (FOLLOW_UPS[(i + r) % len(FOLLOW_UPS)], "warm")):
        result = chat_turn(client, messages, user, q, args.max_tokens)
        for key in ("arrivals_s", "text", "sent_at"):
            del result[key]
        turns.append({"person": i + 1, "round": r, "kind": k, **result})
    return turns


def _print_round(turns: list[dict], r: int) -> None:
    for kind in ("cold", "resumed", "warm"):
        sel = [t for t in turns if t["round"] == r and t["kind"] == kind]
        if sel:
            ttft = [t["ttft_ms"] for t in sel]
            cached = [t["cached_tokens"] for t in sel]
            prompt = [t["prompt_tokens"] for t in sel]
            print(
                f"round {r} {kind:7}: TTFT p50 {pct(ttft, 50):6.0f} ms p90 {pct(ttft, 90):6.0f} ms"
                f"  prompt {prompt}  cached {cached}",
                flush=True,
            )


# --- the ITL case ------------------------------------------------------------------------------


def itl(args) -> None:
    """One stream alone, beside `others` resumed conversations (restored), alone again."""
    others = [[] for _ in range(args.others)]
    texts = first_turns(args.others + args.fillers, args.words)
    run = {"args": vars(args), "cases": [], "snapshots": []}
    with client_for(args.url) as client:
        # set-up: the others' first turns, then the fillers', which take the cells
        for i, messages in enumerate(others):
            chat_turn(client, messages, f"other-{i + 1:02d}", texts[i], args.max_tokens)
        for j in range(args.fillers):
            text = texts[args.others + j]
            chat_turn(client, [], f"filler-{j + 1:02d}", text, args.max_tokens)
        run["snapshots"].append(snapshot(args, "before the streams"))
        run["cases"].append({"case": "alone", **_stream(args)})
        run["cases"].append({"case": "beside restores", **_beside(args, others)})
        run["cases"].append({"case": "alone, after", **_stream(args)})
        run["snapshots"].append(snapshot(args, "after the streams"))
    for case in run["cases"]:
        gaps = case["gaps_ms"]
        print(
            f"{case['case']:16}: {len(gaps) + 1} chunks, gap p50 {pct(gaps, 50):.0f} ms "
            f"p99 {pct(gaps, 99):.0f} ms max {max(gaps, default=0):.0f} ms",
            flush=True,
        )
    Path(args.out).write_text(json.dumps(run, indent=1))


def _stream(args) -> dict:
    """The streamer's reply (a completion, so no stop sequence cuts it short): its gaps."""
    with client_for(args.url) as client:
        body = {"prompt": STREAM_PROMPT, "max_tokens": args.stream_tokens, "user": "streamer"}
        result = stream(client, "/v1/completions", body)
    t = result["arrivals_s"]
    del result["text"]
    return {**result, "gaps_ms": [1000 * (b - a) for a, b in itertools.pairwise(t)]}


def _beside(args, others: list[list]) -> dict:
    """The stream while each of the others resumes its conversation (all at once, once the
    stream has run for fire_delay_s); the gaps while their restores and prefills are under way
    (until the last of their first tokens) apart."""
    replies: list[dict] = [{} for _ in others]
    box: dict = {}
    streamer = threading.Thread(target=lambda: box.update(_stream(args)))
    streamer.start()
    time.sleep(args.fire_delay_s)
    fired = time.perf_counter()

    def resume(i: int) -> None:
        with client_for(args.url) as client:
            question = QUESTIONS[i % len(QUESTIONS)]
            r = chat_turn(client, others[i], f"other-{i + 1:02d}", question, args.max_tokens)
        del r["arrivals_s"], r["text"]
        replies[i] = r

    threads = [threading.Thread(target=resume, args=(i,)) for i in range(len(others))]
    for t in threads:
        t.start()
    for t in [*threads, streamer]:
        t.join()
    start, end = fired, max(r["sent_at"] + r["ttft_ms"] / 1000 for r in replies)
    at = [box["sent_at"] + a for a in box["arrivals_s"]]
    in_window = [1000 * (b - a) for a, b in itertools.pairwise(at) if b > start and a < end]
    window = (start - box["sent_at"], end - box["sent_at"])  # on the stream's clock
    return {**box, "others": replies, "restore_window_s": window, "gaps_in_window_ms": in_window}


# --- models.toml -------------------------------------------------------------------------------


def models_toml(args) -> None:
    """The checkout's models.toml with n_ctx, and the tiers off with --no-tiers."""
    from localserve import config as cfg

    text = Path(args.base).read_text(encoding="utf-8")
    model = tomllib.loads(text).get("default", "gemma-3-270m")
    tables = {
        cfg.ModelConfig: f"models.{model}",
        cfg.SchedulerConfig: "scheduler",
        cfg.ServerConfig: "server",
    }
    lines = set_key(text.splitlines(), f"models.{model}", "n_ctx", str(args.n_ctx))
    for key in ("host_cache_mib", "disk_cache_mib") if args.no_tiers else ():
        table = next((t for s, t in tables.items() if key in s.__struct_fields__), None)
        if table is None:
            print(f"models-toml: {key} is not a models.toml key in this checkout: not set")
            continue
        lines = set_key(lines, table, key, "0")
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg.load_config(args.out)  # a bad key fails here, not in the server


def set_key(lines: list[str], table: str, key: str, value: str) -> list[str]:
    """`lines` with `key = value` in [table] (replaced, else added under the header)."""
    lines = list(lines)
    header = next((i for i, line in enumerate(lines) if line.strip() == f"[{table}]"), None)
    if header is None:
        return lines + ["", f"[{table}]", f"{key} = {value}"]
    end = next(
        (i for i in range(header + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines)
    )
    for i in range(header + 1, end):
        if re.match(rf"\s*{key}\s*=", lines[i]):
            lines[i] = f"{key} = {value}"
            return lines
    lines.insert(header + 1, f"{key} = {value}")
    return lines


# --- the report --------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    """The q-th percentile, linearly interpolated (nan for no values)."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def report(args) -> None:
    """The summary of a results directory, in markdown, on stdout."""
    out = Path(args.dir)
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
    rotations = {k: v for k, v in runs.items() if "turns" in v}
    print("# Prefix cache tiers (issue 48)\n")
    notes = out / "notes.txt"
    if notes.exists() and notes.read_text().strip():
        print("Notes:\n\n" + "\n".join(f"- {n}" for n in notes.read_text().splitlines()) + "\n")
    _rotation_table(rotations)
    _goals(rotations)
    _oddities(rotations)
    _metrics(rotations)
    if "itl" in runs:
        _itl_table(runs["itl"])


def _stats(turns: list[dict], kind: str, key: str = "ttft_ms") -> list[float]:
    return [t[key] for t in turns if t["kind"] == kind and t[key] is not None]


def _fmt(v: float, f: str = "{:,.0f}") -> str:
    return "–" if v is None or v != v else f.format(v)


def _rotation_table(rotations: dict) -> None:
    print(
        "| run | cold TTFT p50 / p90 | resumed TTFT p50 / p90 | warm TTFT p50 / p90 "
        "| resumed ÷ warm p50 / p90 | resumed: prompt / cached tokens (mean) "
        "| RSS end / peak (MiB) | disk tier (MiB) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, run in rotations.items():
        t = run["turns"]
        c, r, w = (_stats(t, k) for k in ("cold", "resumed", "warm"))
        ratio = [pct(r, q) / pct(w, q) for q in (50, 90)]
        prompt, cached = (
            _stats(t, "resumed", "prompt_tokens"),
            _stats(t, "resumed", "cached_tokens"),
        )
        rss = [s["rss_kib"].get("total", 0) / 1024 for s in run["snapshots"]]
        disk = [s["disk_tier_bytes"] for s in run["snapshots"] if s["disk_tier_bytes"] is not None]
        print(
            f"| {name} | {_fmt(pct(c, 50))} / {_fmt(pct(c, 90))} "
            f"| {_fmt(pct(r, 50))} / {_fmt(pct(r, 90))} | {_fmt(pct(w, 50))} / {_fmt(pct(w, 90))} "
            f"| {_fmt(ratio[0], '{:.2f}')} / {_fmt(ratio[1], '{:.2f}')} "
            f"| {_fmt(_mean(prompt))} / {_fmt(_mean(cached))} "
            f"| {_fmt(rss[-1] if rss else None)} / {_fmt(max(rss, default=None))} "
            f"| {_fmt(disk[-1] / 2**20 if disk else None, '{:,.1f}')} |"
        )
    print("\nTTFT in ms, measured by the client (request sent to first content chunk).\n")


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _goals(rotations: dict) -> None:
    """Resumed <= 1.2x warm and <= llama-server's default (p50 and p90); restart <= 2x warm."""
    print("## Goals\n")
    for name, run in rotations.items():
        people = name.rsplit("-", 1)[-1]
        t = run["turns"]
        r, w = _stats(t, "resumed"), _stats(t, "warm")
        if name.startswith("localserve-") and not name.startswith("localserve-no-tiers"):
            peer = rotations.get(f"llama-server-{people}")
            line = _goal(f"{name}: resumed <= 1.2x warm", r, [1.2 * x for x in w])
            if peer:
                line += "; " + _goal(
                    "<= llama-server default's resumed", r, _stats(peer["turns"], "resumed"), ""
                )
            print(f"- {line}")
        elif name.startswith("restart-"):  # against the warm turns after the restart
            w = [x["ttft_ms"] for x in t if x["kind"] == "warm" and x["round"] > 1]
            print(
                f"- {_goal(f'{name} (after a restart): resumed <= 2x warm', r, [2 * x for x in w])}"
            )
    print()


def _goal(label: str, values: list[float], bound: list[float], sep: str = "") -> str:
    parts = []
    for q in (50, 90):
        a, b = pct(values, q), pct(bound, q)
        verdict = "met" if a <= b else "missed" if a == a and b == b else "n/a"
        parts.append(f"p{q} {_fmt(a)} vs {_fmt(b)} ms: {verdict}")
    return f"{label}{sep}: " + ", ".join(parts)


def _oddities(rotations: dict) -> None:
    """Turns that reused nothing where reuse was expected (warm turns; resumed with tiers)."""
    lines = []
    for name, run in rotations.items():
        for t in run["turns"]:
            expected = t["kind"] == "warm" or (
                t["kind"] == "resumed" and "no-tiers" not in name and "cram0" not in name
            )
            if expected and not t["cached_tokens"]:
                lines.append(
                    f"- {name}: round {t['round']} person {t['person']} {t['kind']}: "
                    f"cached {t['cached_tokens']} of {t['prompt_tokens']}, "
                    f"TTFT {t['ttft_ms']:.0f} ms"
                )
            if t["is_empty"]:
                lines.append(
                    f"- {name}: round {t['round']} person {t['person']} {t['kind']}: empty reply"
                )
    if lines:
        print("## Turns that reused nothing where reuse was expected, or empty replies\n")
        print("\n".join(lines) + "\n")


def _metrics(rotations: dict) -> None:
    print("## localserve /metrics at the end of each run (prefix, host, disk, restore series)\n")
    for name, run in rotations.items():
        m = run["snapshots"][-1]["metrics"] if run["snapshots"] else {}
        if m:
            shown = ", ".join(
                f"`{_series(k)}` {v:g}" for k, v in m.items() if not k.endswith("_created")
            )
            print(f"- {name}: {shown}")
    print()


def _series(name: str) -> str:
    """A series' name without the prefix and the model label: `tier_hits_total{tier="host"}`."""
    name = name.removeprefix("localserve:")
    labels = re.sub(r'(^|,)model_name="[^"]*"', "", name.partition("{")[2].rstrip("}")).strip(",")
    return name.partition("{")[0] + (f"{{{labels}}}" if labels else "")


def _itl_table(run: dict) -> None:
    target = run["args"].get("itl_target_ms", 120)
    print(f"## A stream's ITL while {run['args']['others']} conversations are restored beside it\n")
    print(
        "| case | chunks | gap p50 / p99 / max (ms) "
        "| in the restore window p50 / p99 / max | within target |"
    )
    print("|---|---:|---:|---:|---|")
    for case in run["cases"]:
        g = case["gaps_ms"]
        w = case.get("gaps_in_window_ms", [])
        verdict = "yes" if max(g, default=0) <= target else "no"
        window = (
            f"{_fmt(pct(w, 50))} / {_fmt(pct(w, 99))} / {_fmt(max(w, default=None))}" if w else ""
        )
        print(
            f"| {case['case']} | {len(g) + 1} | {_fmt(pct(g, 50))} / {_fmt(pct(g, 99))} / "
            f"{_fmt(max(g, default=None))} | {window} | {verdict} (max <= {target:g} ms) |"
        )
    beside = next(c for c in run["cases"] if c["case"] == "beside restores")
    o = beside["others"]
    print(
        f"\nThe others' resumed turns: TTFT p50 {_fmt(pct([x['ttft_ms'] for x in o], 50))} ms, "
        f"max {_fmt(max(x['ttft_ms'] for x in o))} ms; "
        f"cached tokens {[x['cached_tokens'] for x in o]} of {[x['prompt_tokens'] for x in o]}."
    )
    before, after = (snap["metrics"] for snap in run["snapshots"])
    hits = {_series(k): v - before.get(k, 0) for k, v in after.items() if "tier_hits_total" in k}
    print(f"Restores during the streams (tier hits, /metrics): {hits or 'no such series'}.")


# --- the command line --------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("rotation", "itl"):
        s = sub.add_parser(name)
        s.add_argument("--url", required=True, help="http://127.0.0.1:PORT")
        s.add_argument("--pid", type=int, help="the server's process (its RSS, children included)")
        s.add_argument("--disk-dir", help="the disk tier's directory (its size is recorded)")
        s.add_argument("--words", type=int, default=1250, help="words of a first turn's text")
        s.add_argument("--max-tokens", type=int, default=32)
        s.add_argument("--out", required=True)
    r = sub.choices["rotation"]
    r.add_argument("--people", type=int, default=8)
    r.add_argument("--rounds", type=int, default=4, help="rounds after the first")
    r.add_argument("--phase", choices=("all", "first", "resume"), default="all")
    r.add_argument("--conversations", help="where --phase first saves them, resume reads them")
    i = sub.choices["itl"]
    i.add_argument("--others", type=int, default=8)
    i.add_argument("--fillers", type=int, default=8, help="people whose turns take the cells")
    i.add_argument("--stream-tokens", type=int, default=200)
    i.add_argument("--fire-delay-s", type=float, default=0.5)
    i.add_argument("--itl-target-ms", type=float, default=120)
    m = sub.add_parser("models-toml")
    m.add_argument("--base", default="models.toml")
    m.add_argument("--out", required=True)
    m.add_argument("--n-ctx", type=int, default=8192)
    m.add_argument("--no-tiers", action="store_true")
    sub.add_parser("report").add_argument("dir")
    args = p.parse_args()
    {"rotation": rotation, "itl": itl, "models-toml": models_toml, "report": report}[args.command](
        args
    )


if __name__ == "__main__":
    sys.exit(main())
