"""`localserve bench`: a load generator over the websocket protocol, measured on the client.

Definitions follow vLLM's `bench serve`: TTFT = chat sent -> first token frame; ITL = gaps
between token frames of one request (a frame may carry several tokens when the client reads
slowly); TPOT = (e2e - TTFT) / (output tokens - 1); e2e = sent -> done. Throughput is counted
over the whole run; goodput is the rate of requests that met every SLO given.

Peer mode sends the same workload to an OpenAI-compatible streaming endpoint (llama.cpp's
`llama-server`), so the two servers can be compared side by side.

The `conversation` workload is multi-turn: each conversation reads a document part by part,
every turn resending the whole history (the server's replies included) plus a new part and a
question, so the last turn's prompt is ~2,000 tokens of which all but the new part could come
from a prefix cache. It reports TTFT and cached prompt tokens per turn.

Arrivals are open-loop at a request rate (Poisson, or gamma with a burstiness factor: < 1 is
burstier, 1 is Poisson) or closed-loop at a fixed concurrency. Workloads are built from text
that ships with the project (`localserve/data/pages.md` and the scenario's prompt lists),
seeded and reproducible.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import random
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from localserve.client import Client, ClientError, ConnectionClosed
from localserve.prompt import TRANSCRIPT_STOPS, render_transcript
from localserve.protocol import Chat, Error, Finished, Message, TokenDelta
from localserve.scenario import (
    LONG_EXPLANATIONS,
    MEDIUM_QUESTIONS,
    SHORT_QUESTIONS,
    SUMMARY_REQUESTS,
    TOKENS_PER_WORD,
    pages,
    pages_slice,
)

# kind -> (output tokens, prompt builder); a mix is a weighted choice of kinds
KINDS = ("short", "long", "paste")
WORKLOADS: dict[str, dict[str, float]] = {
    "short": {"short": 1.0},
    "long": {"long": 1.0},
    "paste": {"paste": 1.0},
    "mixed": {"short": 0.5, "long": 0.3, "paste": 0.2},
    "chat": {"short": 0.7, "long": 0.3},
}
OUTPUT_TOKENS = {"short": 48, "long": 320, "paste": 96}
PASTE_TOKENS = 2500


@dataclass(frozen=True)
class RequestSpec:
    kind: str
    prompt: str
    max_tokens: int


@dataclass
class RequestResult:
    kind: str
    ok: bool = False
    error: str = ""
    finish_reason: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the server reused from its cache (0 if unreported)
    output_tokens: int = 0
    sent: float = 0.0
    token_times: list[float] = field(default_factory=list)  # arrival of each token frame
    done: float = 0.0

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.sent if self.token_times else None

    @property
    def e2e(self) -> float:
        return self.done - self.sent

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2 or self.ttft is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]


@dataclass(frozen=True)
class SLO:
    """Service-level objectives in milliseconds (None = not required)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    @classmethod
    def parse(cls, text: str) -> SLO:
        """'ttft=500,tpot=100' -> SLO(ttft_ms=500, tpot_ms=100)."""
        values = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, _, value = item.partition("=")
            if key not in ("ttft", "tpot", "e2e") or not value:
                raise ValueError(f"--slo: {item!r}: expected ttft=MS, tpot=MS or e2e=MS")
            values[f"{key}_ms"] = float(value)
        return cls(**values)

    def met(self, r: RequestResult) -> bool:
        checks = [(self.ttft_ms, r.ttft), (self.tpot_ms, r.tpot), (self.e2e_ms, r.e2e)]
        return r.ok and all(
            limit is None or (value is not None and value * 1e3 <= limit) for limit, value in checks
        )


# --- workloads and arrivals ---------------------------------------------------------------------


def build_requests(workload: str, n: int, seed: int = 0) -> list[RequestSpec]:
    """n requests of a named workload, reproducible for a seed."""
    if workload not in WORKLOADS:
        raise ValueError(f"--workload: {workload!r} is not one of {', '.join(WORKLOADS)}")
    rng = random.Random(seed)
    kinds, weights = zip(*WORKLOADS[workload].items(), strict=True)
    return [_spec(rng.choices(kinds, weights)[0], rng) for _ in range(n)]


def _spec(kind: str, rng: random.Random) -> RequestSpec:
    if kind == "short":
        prompt = rng.choice(SHORT_QUESTIONS)
    elif kind == "long":
        prompt = rng.choice(LONG_EXPLANATIONS)
    else:
        text = pages_slice(rng, round(PASTE_TOKENS / TOKENS_PER_WORD))
        prompt = f"{text}\n\n{rng.choice(SUMMARY_REQUESTS)}"
    if kind == "short" and rng.random() < 0.3:
        prompt = rng.choice(MEDIUM_QUESTIONS)
    return RequestSpec(kind, prompt, OUTPUT_TOKENS[kind])


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Start offsets (s) of n requests: gamma inter-arrivals with mean 1/rate (inf = all at 0)."""
    if rate <= 0 or burstiness <= 0:
        raise ValueError("--request-rate and --burstiness must be positive")
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return out


# --- statistics ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default); None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution_ms(values: Sequence[float]) -> dict[str, float | None]:
    """mean, median, p90, p99 in milliseconds."""
    ms = [v * 1e3 for v in values]
    return {
        "mean": sum(ms) / len(ms) if ms else None,
        "median": percentile(ms, 50),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
    }


def summarize(results: Sequence[RequestResult], duration_s: float, slo: SLO | None = None) -> dict:
    """The run's figures, vLLM style."""
    ok = [r for r in results if r.ok]
    output = sum(r.output_tokens for r in ok)
    prompt = sum(r.prompt_tokens for r in ok)
    duration = max(duration_s, 1e-9)
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error] = errors.get(r.error, 0) + 1
    summary = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": errors,
        "duration_s": duration_s,
        "request_throughput": len(ok) / duration,
        "output_token_throughput": output / duration,
        "total_token_throughput": (prompt + output) / duration,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "ttft_ms": distribution_ms([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": distribution_ms([r.tpot for r in ok if r.tpot is not None]),
        "itl_ms": distribution_ms([gap for r in ok for gap in r.itls]),
        "e2e_ms": distribution_ms([r.e2e for r in ok]),
    }
    if slo is not None:
        good = sum(slo.met(r) for r in results)
        summary["slo"] = asdict(slo)
        summary["goodput"] = good / duration
        summary["good_requests"] = good
    return summary


# --- running -------------------------------------------------------------------------------------


async def send_one(
    url: str, user: str, spec: RequestSpec, ignore_eos: bool, seed: int
) -> RequestResult:
    """One request on its own connection, timed from the chat frame to its done frame."""
    try:
        async with await Client.connect(url, user) as client:
            chat = Chat(id="r", messages=[Message("user", spec.prompt)],
                        max_tokens=spec.max_tokens, temperature=0.7, seed=seed,
                        ignore_eos=ignore_eos)  # fmt: skip
            result, _ = await _ws_chat(client, chat, spec.kind)
    except (OSError, ConnectionClosed, ClientError) as e:
        result = RequestResult(spec.kind, error=type(e).__name__)
    return result


async def _ws_chat(client: Client, chat: Chat, kind: str) -> tuple[RequestResult, str]:
    """Send one chat on an open connection; its timings and the reply text."""
    result, reply = RequestResult(kind), []
    result.sent = time.perf_counter()
    await client.send(chat)
    while True:
        frame = await client.recv()
        if isinstance(frame, TokenDelta) and frame.id == chat.id:
            result.token_times.append(time.perf_counter())
            reply.append(frame.text)
        elif isinstance(frame, Error) and frame.id in (chat.id, None) and frame.code != "internal":
            result.error = frame.code
            break
        elif isinstance(frame, Finished) and frame.id == chat.id:
            result.done = time.perf_counter()
            result.finish_reason = frame.finish_reason
            result.ok = frame.finish_reason in ("stop", "length")
            result.error = "" if result.ok else frame.finish_reason
            result.prompt_tokens = frame.usage.prompt_tokens
            result.cached_tokens = frame.usage.cached_tokens
            result.output_tokens = frame.usage.completion_tokens
            break
    return result, "".join(reply)


async def send_one_openai(
    base_url: str, user: str, spec: RequestSpec, ignore_eos: bool, seed: int,
    endpoint: str = "completions",
) -> RequestResult:  # fmt: skip
    """The same request to an OpenAI-compatible server, streamed (SSE).

    `completions` (any server, llama-server too): the prompt is rendered as the transcript our
    server uses for the embedded base model, so both servers see the same tokens; like ours,
    the end-of-turn stop is dropped for ignore_eos. `chat` (localserve's /v1): the messages,
    rendered by the server exactly as for a websocket chat, under the bench user's name.
    """
    if endpoint == "chat":
        body = {"messages": [{"role": "user", "content": spec.prompt}], "user": user,
                "max_tokens": spec.max_tokens, "temperature": 0.7, "seed": seed,
                "stream": True, "ignore_eos": ignore_eos,
                "stream_options": {"include_usage": True}}  # fmt: skip
    else:
        body = _completion_body([("user", spec.prompt)], spec.max_tokens, 0.7, seed, ignore_eos)
        body["user"] = user  # localserve's per-user limits (llama-server ignores it)
    result, _ = await _openai_request(base_url, body, spec.kind, endpoint)
    return result


def _completion_body(
    messages: Sequence[tuple[str, str]],
    max_tokens: int,
    temperature: float,
    seed: int,
    ignore_eos: bool,
) -> dict:
    return {
        "prompt": render_transcript(messages),
        "max_tokens": max_tokens, "temperature": temperature, "seed": seed, "stream": True,
        "ignore_eos": ignore_eos, "stop": [] if ignore_eos else list(TRANSCRIPT_STOPS),
        "stream_options": {"include_usage": True},
    }  # fmt: skip


async def _openai_request(
    base_url: str, body: dict, kind: str, endpoint: str = "completions"
) -> tuple[RequestResult, str]:
    """POST a streaming /v1/completions (or chat/completions) request; timings and text.

    HTTP/1.1 on an asyncio stream, like the websocket client: one event loop for every user,
    no thread per request (threads would add GIL waits to the timestamps). Cached prompt
    tokens: `usage.prompt_tokens_details.cached_tokens` (OpenAI's field, which llama-server
    fills), else llama-server's `timings.cache_n`.
    """
    result, reply = RequestResult(kind), []
    url = urllib.parse.urlsplit(base_url)
    path = url.path.rstrip("/") + ("/v1/chat/completions" if endpoint == "chat"
                                   else "/v1/completions")  # fmt: skip
    payload = json.dumps(body).encode()
    writer = None
    try:
        reader, writer = await asyncio.open_connection(url.hostname, url.port or 80)
        result.sent = time.perf_counter()
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: "
                     f"application/json\r\nContent-Length: {len(payload)}\r\n"
                     "Connection: close\r\n\r\n".encode() + payload)  # fmt: skip
        status, headers = await _read_head(reader)
        if status != 200:
            result.error = f"http_{status}"
            return result, ""
        cached = None
        async for line in _sse_lines(reader, headers.get("transfer-encoding") == "chunked"):
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk:  # e.g. llama-server's "Context size has been exceeded"
                result.error = str(chunk["error"].get("type") or "server_error")
                return result, "".join(reply)
            cached = _take_chunk(result, reply, chunk, cached)
        result.done = time.perf_counter()
        result.output_tokens = result.output_tokens or len(result.token_times)
        result.cached_tokens = cached or 0
        result.ok = bool(result.finish_reason)
        result.error = "" if result.ok else "no_finish"
    except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as e:
        result.error = type(e).__name__
    finally:
        if writer is not None:
            writer.close()
    return result, "".join(reply)


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """An HTTP response's status and headers (names in lower case)."""
    status = int((await reader.readline()).split()[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def _take_chunk(result: RequestResult, reply: list[str], chunk: dict, cached: int | None):
    """Fold one streamed chunk into the result; returns the cached-token count seen so far."""
    choices = chunk.get("choices") or []
    text = choices and (choices[0].get("text") or (choices[0].get("delta") or {}).get("content"))
    if text:
        result.token_times.append(time.perf_counter())
        reply.append(text)
    if choices and choices[0].get("finish_reason"):
        result.finish_reason = choices[0]["finish_reason"]
    usage = chunk.get("usage") or {}
    if usage:
        result.prompt_tokens = usage.get("prompt_tokens", 0)
        result.output_tokens = usage.get("completion_tokens", 0)
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            cached = details["cached_tokens"]
    timings = chunk.get("timings") or {}
    if cached is None and timings.get("cache_n") is not None:
        cached = timings["cache_n"]
    if not result.prompt_tokens and "prompt_n" in timings:
        result.prompt_tokens = timings["prompt_n"] + timings.get("cache_n", 0)
    return cached


async def _sse_lines(reader: asyncio.StreamReader, chunked: bool):
    """The body's lines (decoded, stripped), through chunked transfer coding if used."""
    buffer = b""
    while True:
        if chunked:
            size = int((await reader.readline()).split(b";")[0], 16)
            data = (await reader.readexactly(size + 2))[:-2]  # the chunk, less its CRLF
        else:
            data = await reader.read(65536)
        if not data:
            if buffer.strip():
                yield buffer.decode().strip()
            return
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield line.decode().strip()


async def run_load(
    url: str,
    specs: Sequence[RequestSpec],
    *,
    rate: float = math.inf,
    burstiness: float = 1.0,
    concurrency: int | None = None,
    ignore_eos: bool = False,
    seed: int = 0,
    on_done: Callable[[int, int], None] | None = None,
    openai: bool = False,
    endpoint: str = "completions",
) -> tuple[list[RequestResult], float]:
    """Send every request (open loop at `rate`, or closed loop at `concurrency`).

    `url` is a localserve websocket URL, or with `openai` an OpenAI-compatible base URL (its
    `endpoint`: completions or chat).
    """
    send = functools.partial(send_one_openai, endpoint=endpoint) if openai else send_one
    results: list[RequestResult | None] = [None] * len(specs)
    finished = 0
    start = time.perf_counter()

    async def one(i: int) -> None:
        nonlocal finished
        results[i] = await send(url, f"bench-{i}", specs[i], ignore_eos, seed + i)
        finished += 1
        if on_done:
            on_done(finished, len(specs))

    if concurrency:
        queue = iter(range(len(specs)))

        async def worker() -> None:
            for i in queue:
                await one(i)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    else:
        offsets = arrival_times(len(specs), rate, burstiness, seed)

        async def delayed(i: int) -> None:
            await asyncio.sleep(max(0.0, start + offsets[i] - time.perf_counter()))
            await one(i)

        await asyncio.gather(*(delayed(i) for i in range(len(specs))))
    return [r for r in results if r is not None], time.perf_counter() - start


def format_summary(s: dict) -> str:
    """A readable block, like vLLM's."""
    lines = [
        f"completed {s['completed']}, failed {s['failed']} {s['errors'] or ''}".rstrip(),
        f"duration {s['duration_s']:.1f} s; requests {s['request_throughput']:.2f}/s; "
        f"output {s['output_token_throughput']:.1f} tok/s; "
        f"total {s['total_token_throughput']:.1f} tok/s",
    ]
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        d = s[name]
        cells = " ".join(f"{k} {_num(v)}" for k, v in d.items())
        lines.append(f"{name[:-3].upper():5} (ms): {cells}")
    if "goodput" in s:
        lines.append(f"goodput {s['goodput']:.2f} req/s ({s['good_requests']} met {s['slo']})")
    return "\n".join(lines)


def _num(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


# --- the origin scenario -------------------------------------------------------------------------


async def origin_scenario(url: str, openai: bool = False, seed: int = 0) -> dict:
    """Three users stream; a ~3,000-token paste arrives; a short question arrives meanwhile.

    Measures the worst gap between tokens of the users already streaming while the paste is
    prefilled, and the short question's TTFT, against the same question on an idle server.
    """
    send = send_one_openai if openai else send_one
    rng = random.Random(seed)
    question = RequestSpec("short", SHORT_QUESTIONS[0], 16)
    await send(url, "warmup", question, True, seed)  # first decodes allocate buffers
    idle = await send(url, "idle", question, True, seed)
    streams = [RequestSpec("long", LONG_EXPLANATIONS[i], 400) for i in range(3)]
    text = pages_slice(rng, round(3000 / TOKENS_PER_WORD))
    paste = RequestSpec("paste", f"{text}\n\n{SUMMARY_REQUESTS[0]}", 32)
    tasks = [
        asyncio.create_task(send(url, f"s{i}", s, True, seed + i)) for i, s in enumerate(streams)
    ]
    await asyncio.sleep(4.0)  # everyone is streaming
    paste_task = asyncio.create_task(send(url, "paster", paste, True, seed))
    await asyncio.sleep(1.0)  # the paste is being prefilled
    asked = await send(url, "asker", question, True, seed)
    pasted = await paste_task
    streamed = await asyncio.gather(*tasks)
    window = (pasted.sent, pasted.token_times[0] if pasted.token_times else pasted.done)
    gaps = [b - a for r in streamed for a, b in zip(r.token_times, r.token_times[1:], strict=False)
            if window[0] <= b <= window[1]]  # fmt: skip
    return {
        "paste_prompt_tokens": pasted.prompt_tokens,
        "paste_ttft_ms": _ms(pasted.ttft),
        "worst_stream_gap_during_paste_ms": _ms(max(gaps, default=None)),
        "median_stream_gap_during_paste_ms": _ms(percentile(gaps, 50)),
        "question_ttft_idle_ms": _ms(idle.ttft),
        "question_ttft_during_paste_ms": _ms(asked.ttft),
        "ttft_ratio": (asked.ttft / idle.ttft) if asked.ttft and idle.ttft else None,
        "all_ok": all(r.ok for r in [idle, asked, pasted, *streamed]),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


# --- the conversation workload (multi-turn, prefix reuse) -----------------------------------------

TURN_TOKENS = 350  # document tokens per user turn: turn 5's prompt is ~2,000 tokens
REPLY_TOKENS = 64
FIRST_PART = "Here is the first part of a document I am reading:"
NEXT_PART = "Here is the next part:"
TEXT_QUESTIONS = [
    "What is this part about? Answer in two sentences.",
    "Which detail in this part stands out most, and why?",
    "How does this part connect to what came before?",
    "Summarise this part for someone in a hurry.",
    "What is the main point of this part?",
    "What question would you ask the author about this part?",
]


@dataclass(frozen=True)
class Conversation:
    """One conversation's user messages, in order (the replies come from the server)."""

    user_messages: tuple[str, ...]


@dataclass
class ConversationResult:
    index: int
    user: str
    turns: list[RequestResult] = field(default_factory=list)  # stops at the first failure
    replies: list[str] = field(default_factory=list)
    cold: RequestResult | None = None  # the last turn again, without reuse (cold replay)


def _document_words() -> list[tuple[str, bool]]:
    """pages.md as (word, ends a paragraph) pairs."""
    return [(w, i == len(p.split()) - 1) for p in pages() for i, w in enumerate(p.split())]


def build_conversations(
    n: int, turns: int, turn_tokens: int = TURN_TOKENS, seed: int = 0
) -> list[Conversation]:
    """n conversations reading pages.md part by part, reproducible for a seed.

    Each user turn is a new part of ~turn_tokens tokens (consecutive words of the text, from a
    random paragraph start, wrapping around at its end) and a question about it.
    """
    if n < 1 or turns < 1 or turn_tokens < 1:
        raise ValueError("--conversations, --turns and --turn-tokens must be at least 1")
    rng = random.Random(seed)
    words = _document_words()
    starts = [0] + [i + 1 for i, (_, end) in enumerate(words[:-1]) if end]
    per_turn = max(1, round(turn_tokens / TOKENS_PER_WORD))
    out = []
    for _ in range(n):
        at = rng.choice(starts)
        messages = []
        for turn in range(turns):
            part = [words[(at + j) % len(words)] for j in range(per_turn)]
            at = (at + per_turn) % len(words)
            text = "".join(w + ("\n\n" if end else " ") for w, end in part).strip()
            intro = FIRST_PART if turn == 0 else NEXT_PART
            messages.append(f"{intro}\n\n{text}\n\n{rng.choice(TEXT_QUESTIONS)}")
        out.append(Conversation(tuple(messages)))
    return out


def turn_messages(conv: Conversation, replies: Sequence[str], turn: int) -> list[tuple[str, str]]:
    """The messages of turn `turn` (1-based): the history so far, then the new user message."""
    if len(replies) < turn - 1:
        raise ValueError(f"turn {turn} needs {turn - 1} replies, got {len(replies)}")
    messages = []
    for k in range(turn - 1):
        messages += [("user", conv.user_messages[k]), ("assistant", replies[k])]
    return [*messages, ("user", conv.user_messages[turn - 1])]


def estimate_prompt_tokens(messages: Sequence[tuple[str, str]]) -> int:
    """Rough prompt size of the rendered transcript (words x TOKENS_PER_WORD)."""
    return round(len(render_transcript(messages).split()) * TOKENS_PER_WORD)


async def run_conversations(
    url: str,
    conversations: Sequence[Conversation],
    *,
    max_tokens: int = REPLY_TOKENS,
    concurrency: int = 1,
    ignore_eos: bool = False,
    seed: int = 0,
    cold: bool = False,
    warmup: bool = True,
    openai: bool = False,
    on_done: Callable[[int, int], None] | None = None,
) -> tuple[list[ConversationResult], float]:
    """Play every conversation turn by turn, greedy; `concurrency` conversations at a time.

    localserve: one connection per conversation, user `conv-<i>`. Peer (`openai`): one
    /v1/completions request per turn, the history rendered as our transcript. With `cold`, the
    last turn is sent once more without reuse — on localserve as another user (whose cache it
    may not use unless the server shares prefixes across users), on a peer with
    `cache_prompt: false` (llama-server's switch) — for a with/without comparison in one run.
    """
    results = [ConversationResult(i, f"conv-{i}") for i in range(len(conversations))]
    steps = len(conversations) * (len(conversations[0].user_messages) if conversations else 0)
    finished = 0
    if warmup:  # first decodes allocate buffers
        send = send_one_openai if openai else send_one
        await send(url, "warmup", RequestSpec("short", SHORT_QUESTIONS[0], 8), True, seed)

    def done_one() -> None:
        nonlocal finished
        finished += 1
        if on_done:
            on_done(finished, steps)

    async def ask(
        out: ConversationResult, client: Client | None, messages: list[tuple[str, str]],
        kind: str, reuse: bool = True,
    ) -> tuple[RequestResult, str]:  # fmt: skip
        req_seed = seed + out.index
        if openai:
            body = _completion_body(messages, max_tokens, 0.0, req_seed, ignore_eos)
            if not reuse:
                body["cache_prompt"] = False
            return await _openai_request(url, body, kind)
        assert client is not None
        chat = Chat(id=kind, messages=[Message(r, c) for r, c in messages],
                    max_tokens=max_tokens, temperature=0.0, seed=req_seed,
                    ignore_eos=ignore_eos)  # fmt: skip
        return await _ws_chat(client, chat, kind)

    async def play(i: int) -> None:
        conv, out = conversations[i], results[i]
        client, played = None, 0
        try:
            if not openai:
                client = await Client.connect(url, out.user)
            for turn in range(1, len(conv.user_messages) + 1):
                messages = turn_messages(conv, out.replies, turn)
                result, reply = await ask(out, client, messages, f"turn-{turn}")
                out.turns.append(result)
                out.replies.append(reply)
                played += 1
                done_one()
                if not result.ok:
                    return
            if cold:
                last = turn_messages(conv, out.replies[:-1], len(conv.user_messages))
                if openai:
                    out.cold, _ = await ask(out, None, last, "cold", reuse=False)
                else:
                    async with await Client.connect(url, f"{out.user}-cold") as other:
                        out.cold, _ = await ask(out, other, last, "cold")
        except (OSError, ConnectionClosed, ClientError) as e:
            failed = RequestResult(f"turn-{len(out.turns) + 1}", error=type(e).__name__)
            if len(out.turns) < len(conv.user_messages):
                out.turns.append(failed)
            else:
                out.cold = RequestResult("cold", error=failed.error)
        finally:
            if client is not None:
                await client.close()
            for _ in range(len(conv.user_messages) - played):
                done_one()  # turns never played still move the progress to its end

    start = time.perf_counter()
    queue = iter(range(len(conversations)))

    async def worker() -> None:
        for i in queue:
            await play(i)

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return results, time.perf_counter() - start


def _turn_row(label: str | int, results: Sequence[RequestResult], expected: int) -> dict:
    ok = [r for r in results if r.ok]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error] = errors.get(r.error, 0) + 1
    if expected > len(results):
        errors["not_reached"] = expected - len(results)
    prompt = [r.prompt_tokens for r in ok]
    cached = [r.cached_tokens for r in ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {
        "turn": label,
        "completed": len(ok),
        "failed": expected - len(ok),
        "errors": errors,
        "prompt_tokens": {"mean": mean(prompt), "min": min(prompt, default=None),
                          "max": max(prompt, default=None)},
        "cached_tokens": {"mean": mean(cached), "min": min(cached, default=None),
                          "max": max(cached, default=None)},
        "cached_share": sum(cached) / sum(prompt) if sum(prompt) else None,
        "output_tokens": mean([r.output_tokens for r in ok]),
        "ttft_ms": distribution_ms(ttfts),
        "ttft_samples": len(ttfts),  # an empty reply has no first token
        "e2e_ms": distribution_ms([r.e2e for r in ok]),
    }  # fmt: skip


def summarize_conversations(results: Sequence[ConversationResult], duration_s: float) -> dict:
    """Per-turn figures across conversations, the cold replay's, and the last turn's ratio."""
    n = len(results)
    turns = max((len(c.turns) for c in results), default=0)
    rows = [_turn_row(k, [c.turns[k - 1] for c in results if len(c.turns) >= k], n)
            for k in range(1, turns + 1)]  # fmt: skip
    colds = [c.cold for c in results if c.cold is not None]
    cold = _turn_row("cold", colds, len(colds)) if colds else None
    last = rows[-1] if rows else None
    ratio = None
    if last and cold and last["ttft_ms"]["median"] and cold["ttft_ms"]["median"]:
        ratio = last["ttft_ms"]["median"] / cold["ttft_ms"]["median"]
    return {
        "conversations": n,
        "duration_s": duration_s,
        "completed": sum(all(r.ok for r in c.turns) and len(c.turns) == turns for c in results),
        "turns": rows,
        "cold": cold,
        "last_turn": None if last is None else {
            "turn": last["turn"],
            "ttft_median_ms": last["ttft_ms"]["median"],
            "ttft_mean_ms": last["ttft_ms"]["mean"],
            "cold_ttft_median_ms": cold["ttft_ms"]["median"] if cold else None,
            "ratio_to_cold": ratio,
        },
    }  # fmt: skip


def format_conversations(s: dict) -> str:
    """A per-turn table and the last turn's line."""
    lines = [
        f"{s['conversations']} conversations, {s['completed']} complete, {s['duration_s']:.1f} s",
        f"{'turn':>5} {'ok':>5} {'prompt':>7} {'cached':>7} {'TTFT mean':>10} {'median':>8} "
        f"{'p90 (ms)':>9}",
    ]
    for row in [*s["turns"], *([s["cold"]] if s["cold"] else [])]:
        t = row["ttft_ms"]
        lines.append(
            f"{row['turn']:>5} {row['completed']:>2}/{row['completed'] + row['failed']:<2} "
            f"{_num0(row['prompt_tokens']['mean']):>7} {_num0(row['cached_tokens']['mean']):>7} "
            f"{_num0(t['mean']):>10} {_num0(t['median']):>8} {_num0(t['p90']):>9}"
            + (f"  {row['errors']}" if row["errors"] else "")
        )
    last = s["last_turn"]
    if last and last["ratio_to_cold"] is not None:
        lines.append(
            f"turn {last['turn']} TTFT median {last['ttft_median_ms']:.0f} ms, cold "
            f"{last['cold_ttft_median_ms']:.0f} ms: {100 * last['ratio_to_cold']:.0f}%"
        )
    return "\n".join(lines)


def _num0(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}"
