"""Forced tool calls and schema'd replies, as the real client libraries see them.

Drives a `localserve serve` (its own, on the embedded gemma-3-270m, or `--url` of a running one)
with the OpenAI, Anthropic, LangChain, instructor and pydantic-ai clients, one request at a time,
and counts the tries whose reply is usable: exactly ONE tool call (or one parsed object) whose
arguments validate against the schema, with no key outside its properties (pydantic models with
`extra="forbid"`). The tool is `get_weather(city: str, unit: "celsius" | "fahrenheit")`, the
structured reply `City(name: str, population: int, country: str)` (`population` unbounded on
purpose). Each case runs --tries tries at temperature 0 and --tries at 0.8, a different seed
each try (`seed=` or pydantic-ai's model settings; the Anthropic cases have none, the Messages
API has no seed, so their sampled tries are the server's own draws), 64 tokens at most.

    .venv/bin/pip install langchain-openai instructor "pydantic-ai-slim[openai]"  # + openai,
    .venv/bin/python benchmarks/forced_calls_validate.py [--tries 20] [--url URL]  # anthropic

Prints the client packages' versions, then a markdown table (case | ok/tries at temperature 0 |
at 0.8 | mean seconds per try | a failure sample); the raw results (every failure's first 200
characters, every try's seconds) as JSON to --out (bench-results/forced_calls.json), rewritten
after each case. `--only TEXT` runs the cases whose name holds TEXT.

Versions first measured with: openai 3.57.0, anthropic 2.15.0, langchain-openai 1.7.4
(langchain-core 1.8.3), instructor 1.17.0 (it asks jiter<0.15, ran with 0.19.0, which openai
3.57 needs), pydantic-ai-slim 2.38.0, pydantic 2.14.4.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import anthropic
import instructor
import openai
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

MODEL = "gemma-3-270m"
MAX_TOKENS = 64
PACKAGES = ["openai", "anthropic", "langchain-openai", "langchain-core", "instructor"]
PACKAGES += ["pydantic-ai-slim", "pydantic"]
WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris?"}]
CITY_Q = [{"role": "user", "content": "Tell me about Paris as JSON."}]


class GetWeather(BaseModel):
    """Get the current weather in a city."""

    model_config = ConfigDict(extra="forbid", title="get_weather")
    city: str = Field(description="the city's name")
    unit: Literal["celsius", "fahrenheit"]


class City(BaseModel):
    """A city."""

    model_config = ConfigDict(extra="forbid")
    name: str
    population: int
    country: str


PARAMS = GetWeather.model_json_schema()
PARAMS.pop("title"), PARAMS.pop("description")
OPENAI_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": GetWeather.__doc__, "parameters": PARAMS},
}
ANTHROPIC_TOOL = {"name": "get_weather", "description": GetWeather.__doc__, "input_schema": PARAMS}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ANTHROPIC_NAMED = {"type": "tool", "name": "get_weather"}


class Unusable(Exception):
    """A reply that came back but is not what the caller asked for."""


def one_call(calls: list[tuple[str, Any]]) -> None:
    """Exactly one call of get_weather whose arguments (a JSON text or a dict) validate."""
    if len(calls) != 1:
        raise Unusable(f"{len(calls)} calls: {calls!r}")
    name, args = calls[0]
    if name != "get_weather":
        raise Unusable(f"called {name!r}: {args!r}")
    try:
        if isinstance(args, str):
            GetWeather.model_validate_json(args)
        else:
            GetWeather.model_validate(args)
    except ValueError as e:
        raise Unusable(f"{args!r}: {e}") from e


def a_city(obj: Any) -> None:
    if not isinstance(obj, City):
        raise Unusable(f"not a City: {obj!r}")
    City.model_validate(obj.model_dump())  # extra="forbid" already held when it was parsed


# --- the cases: each one try, raising on anything unusable ------------------------------------


def openai_whole(c: Clients, t: float, seed: int, choice: Any) -> None:
    r = c.openai.chat.completions.create(
        model=MODEL, messages=WEATHER_Q, tools=[OPENAI_TOOL], tool_choice=choice,
        temperature=t, seed=seed, max_tokens=MAX_TOKENS,
    )  # fmt: skip
    calls = r.choices[0].message.tool_calls or []
    one_call([(x.function.name, x.function.arguments) for x in calls])


def openai_stream(c: Clients, t: float, seed: int, choice: Any) -> None:
    stream = c.openai.chat.completions.create(
        model=MODEL, messages=WEATHER_Q, tools=[OPENAI_TOOL], tool_choice=choice,
        temperature=t, seed=seed, max_tokens=MAX_TOKENS, stream=True,
    )  # fmt: skip
    calls: dict[int, list[str]] = {}  # index -> [name, arguments]
    for chunk in stream:
        for choice_delta in chunk.choices:
            for d in choice_delta.delta.tool_calls or []:
                call = calls.setdefault(d.index, ["", ""])
                if d.function and d.function.name:
                    call[0] += d.function.name
                if d.function and d.function.arguments:
                    call[1] += d.function.arguments
    one_call([(name, args) for name, args in calls.values()])


def anthropic_call(c: Clients, t: float, seed: int, choice: dict) -> None:
    """No seed: the Messages API has none. temperature raw: anthropic 2.x dropped it from create."""
    r = c.anthropic.messages.create(
        model=MODEL, messages=WEATHER_Q, tools=[ANTHROPIC_TOOL], tool_choice=choice,
        max_tokens=MAX_TOKENS, extra_body={"temperature": t},
    )  # fmt: skip
    one_call([(b.name, b.input) for b in r.content if b.type == "tool_use"])


def langchain_tools(c: Clients, t: float, seed: int) -> None:
    llm = c.langchain(t, seed).bind_tools([GetWeather], tool_choice="any")
    reply = llm.invoke(WEATHER_Q)
    bad = [(x["name"], x["args"]) for x in reply.invalid_tool_calls]  # arguments not JSON
    one_call([(x["name"], x["args"]) for x in reply.tool_calls] + bad)


def langchain_structured(c: Clients, t: float, seed: int, method: str) -> None:
    a_city(c.langchain(t, seed).with_structured_output(City, method=method).invoke(CITY_Q))


def instructor_city(c: Clients, t: float, seed: int, mode: instructor.Mode) -> None:
    client = instructor.from_openai(c.openai, mode=mode)
    city = client.chat.completions.create(
        model=MODEL, messages=CITY_Q, response_model=City, max_retries=0,
        temperature=t, seed=seed, max_tokens=MAX_TOKENS,
    )  # fmt: skip
    a_city(city)


def pydantic_ai_city(c: Clients, t: float, seed: int) -> None:
    settings = {"temperature": t, "max_tokens": MAX_TOKENS, "seed": seed}
    a_city(c.agent.run_sync(CITY_Q[0]["content"], model_settings=settings).output)


def openai_parse(c: Clients, t: float, seed: int) -> None:
    r = c.openai.chat.completions.parse(
        model=MODEL, messages=CITY_Q, response_format=City,
        temperature=t, seed=seed, max_tokens=MAX_TOKENS,
    )  # fmt: skip
    a_city(r.choices[0].message.parsed)


CASES: list[tuple[str, Callable[..., None], tuple]] = [
    ("openai tool_choice=required, whole", openai_whole, ("required",)),
    ("openai tool_choice=required, streamed", openai_stream, ("required",)),
    ("openai named function, whole", openai_whole, (NAMED,)),
    ("openai named function, streamed", openai_stream, (NAMED,)),
    ("anthropic tool_choice any", anthropic_call, ({"type": "any"},)),
    ("anthropic tool_choice tool get_weather", anthropic_call, (ANTHROPIC_NAMED,)),
    ("langchain bind_tools(tool_choice=any)", langchain_tools, ()),
    ("langchain structured, function_calling", langchain_structured, ("function_calling",)),
    ("langchain structured, json_schema", langchain_structured, ("json_schema",)),
    ("instructor Mode.TOOLS", instructor_city, (instructor.Mode.TOOLS,)),
    ("instructor Mode.JSON_SCHEMA", instructor_city, (instructor.Mode.JSON_SCHEMA,)),
    ("pydantic-ai Agent(output_type=City)", pydantic_ai_city, ()),
    ("openai chat.completions.parse(City)", openai_parse, ()),
]


class Clients:
    """The clients, made once, all pointing at one server."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.openai = openai.OpenAI(base_url=f"{root}/v1", api_key="x", max_retries=0)
        self.anthropic = anthropic.Anthropic(base_url=root, api_key="x", max_retries=0)
        provider = OpenAIProvider(base_url=f"{root}/v1", api_key="x")
        self.agent = Agent(OpenAIChatModel(MODEL, provider=provider), output_type=City, retries=0)

    def langchain(self, t: float, seed: int) -> ChatOpenAI:
        return ChatOpenAI(
            base_url=f"{self.root}/v1", api_key="x", model=MODEL, temperature=t,
            max_tokens=MAX_TOKENS, seed=seed, max_retries=0,
        )  # fmt: skip


def run_case(clients: Clients, fn: Callable[..., None], extra: tuple, tries: int) -> dict:
    row: dict[str, Any] = {"seconds": []}
    for t in (0.0, 0.8):
        ok, failures = 0, []
        for i in range(tries):
            start = time.perf_counter()
            try:
                fn(clients, t, 1000 + i, *extra)
                ok += 1
            except Exception as e:  # the point: whatever the client raises is a failed try
                failures.append(f"seed {1000 + i}: {type(e).__name__}: {e}"[:200])
            row["seconds"].append(time.perf_counter() - start)
        row[str(t)] = {"ok": ok, "tries": tries, "failures": failures}
    row["mean_s"] = statistics.fmean(row["seconds"])
    return row


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(root: Path, state_dir: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [str(root / ".venv/bin/localserve"), "serve", "--port", str(port)]
    server = subprocess.Popen(
        [*cmd, "--state-dir", state_dir], cwd=root,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            if urllib.request.urlopen(f"{url}/healthz", timeout=2).status == 200:
                return server, url
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.5)
    server.kill()
    raise SystemExit("the server did not answer /healthz")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=20, help="tries per case and temperature")
    parser.add_argument("--url", help="a running server's root (default: start one)")
    parser.add_argument("--out", default="bench-results/forced_calls.json")
    parser.add_argument("--only", help="run only the cases whose name contains this")
    args = parser.parse_args()
    versions = {p: importlib.metadata.version(p) for p in PACKAGES}
    print("versions:", ", ".join(f"{p} {v}" for p, v in versions.items()), flush=True)
    root = Path(__file__).resolve().parent.parent
    server, state = None, tempfile.TemporaryDirectory(prefix="forced-calls-")
    if args.url:
        url = args.url.rstrip("/").removesuffix("/v1")
    else:
        server, url = start_server(root, state.name)
    results: dict[str, dict] = {}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        clients = Clients(url)
        for name, fn, extra in CASES:
            if args.only and args.only not in name:
                continue
            results[name] = r = run_case(clients, fn, extra, args.tries)
            print(f"{name}: {r['0.0']['ok']}/{args.tries}, {r['0.8']['ok']}/{args.tries}",
                  file=sys.stderr, flush=True)  # fmt: skip
            # after every case: a long run stopped halfway still leaves what it measured
            report = {"versions": versions, "url": url, "tries": args.tries, "cases": results}
            out.write_text(json.dumps(report, indent=1))
    finally:
        if server is not None:
            server.terminate()
            server.wait(60)
        state.cleanup()
    print("\n| case | temperature 0 ok/tries | 0.8 ok/tries | mean s per try | a failure sample |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        cold, hot = r["0.0"], r["0.8"]
        sample = (cold["failures"] + hot["failures"] or [""])[0].replace("|", "\\|")
        sample = sample.replace("\n", " ")
        print(f"| {name} | {cold['ok']}/{cold['tries']} | {hot['ok']}/{hot['tries']} | "
              f"{r['mean_s']:.2f} | {sample} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
