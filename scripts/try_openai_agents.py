"""openai-agents, on its default model (the Responses API), runs a tool against localserve where
the model writes text beside its call: what issue 50 found refused, tried with the real SDK.

openai-agents pins websockets below the version localserve's stack uses, so it lives in an
environment of its own (made once: ~/.cache/localserve/openai-agents, or `--venv`). The server
is localserve's own (`FakeServer`: the real server and its Responses door, over the fake runner)
with a scripted model: asked first, it writes a call and then a sentence (so the reply's items
are `[function_call, message]`); once the prompt holds the tool's result, it answers. The agent
sends the items back as it got them, with the call's output.

Each request body the agent sent is written to `--record` (default
tests/data/openai_agents_requests.json): tests/unit/serve/responses/test_create.py replays them.

    .venv/bin/python scripts/try_openai_agents.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from localserve.bench.fake_server import FakeServer, PacedRunner  # noqa: E402
from localserve.engine.batch import Sampled  # noqa: E402
from localserve.runners.fake import EOG  # noqa: E402

MODEL = "gemma-3-270m"
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
FIRST = [*CALL, *" Let me look that up for you."]  # a call, then text beside it
AFTER = list("It is 18 C and sunny in Paris.")
RESULT_MARK = "(get_weather):"  # the transcript's line of the tool's result

AGENT = """
import asyncio, json, sys
import httpx2
from openai import AsyncOpenAI
from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled

url, model, record = sys.argv[1:4]
bodies = []

async def keep(request):
    if request.url.path.endswith("/responses"):
        bodies.append(json.loads(request.content))

@function_tool
def get_weather(city: str) -> str:
    \"\"\"The weather in a city, now.\"\"\"
    return f"18 C and sunny in {city}"

async def main():
    set_tracing_disabled(True)
    hooks = httpx2.AsyncClient(event_hooks={"request": [keep]})
    set_default_openai_client(AsyncOpenAI(base_url=url, api_key="none", http_client=hooks))
    agent = Agent(name="helper", instructions="Answer briefly.", tools=[get_weather], model=model)
    try:
        result = await Runner.run(agent, "What is the weather in Paris?")
        print("final output:", result.final_output)
    finally:
        with open(record, "w") as f:
            json.dump(bodies, f, indent=1)

asyncio.run(main())
"""


@dataclass
class TwoTurns(PacedRunner):
    """First a call and text beside it; once the prompt holds the tool's result, an answer."""

    mark: list[int] = field(default_factory=list)

    def _sample(self, item, row=None):
        if not self.mark:
            self.mark = self.tokenize(RESULT_MARK, add_special=False)
        tokens, start = item.seq.tokens, item.seq.num_prompt_tokens
        reply = AFTER if self.mark[0] in tokens[:start] else FIRST
        n = len(tokens) - start
        if n >= len(reply):
            return Sampled(item.seq, EOG, b"", True)
        return Sampled(item.seq, 100 + n, reply[n].encode(), False)


def environment(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "openai-agents"], check=True)
    return python


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cache = Path(os.path.expanduser("~/.cache/localserve/openai-agents"))
    parser.add_argument("--venv", type=Path, default=cache)
    record = ROOT / "tests/data/openai_agents_requests.json"
    parser.add_argument("--record", type=Path, default=record)
    args = parser.parse_args()
    python = environment(args.venv)
    versions = subprocess.run([str(python), "-m", "pip", "list"], capture_output=True, text=True)
    for line in versions.stdout.splitlines():
        if line.split()[:1] in (["openai"], ["openai-agents"]):
            print(line)
    server = FakeServer(name=MODEL, chat_format="transcript", runner=TwoTurns(step_s=0.002))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "agent.py"
            script.write_text(AGENT)
            url = server.url.replace("ws://", "http://") + "/v1"
            run = subprocess.run([str(python), str(script), url, MODEL, str(args.record)])
    finally:
        server.close()
    bodies = json.loads(args.record.read_text())
    for i, body in enumerate(bodies):
        print(f"request {i + 1}:", [item.get("type", "message") for item in body["input"]])
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
