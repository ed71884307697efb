"""The prefix cache's tiers through the real server (the engine in its own process, the OpenAI
door, /metrics): a conversation whose cells went to someone else resumes from host memory, and
after a restart of the server from disk; another person's identical conversation never does.
The tiers' logic is tested on the fake runner (tests/unit/engine/test_prefix_tiers.py), a
restore's arithmetic on the real runner (tests/e2e/test_prefix_tiers_llama.py), the disk files
alone in tests/unit/runners/test_prefix_disk.py."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from localserve.config import Config, ModelConfig, ServerConfig
from tests.support.waiting import wait_until

pytestmark = pytest.mark.model

PAGES = Path(__file__).parents[2] / "localserve" / "bench" / "data" / "pages.md"
WORDS = PAGES.read_text().split()


def config(state: Path) -> Config:
    model = ModelConfig(
        embedded=True,
        chat_format="transcript",
        chat_template="gemma",
        n_ctx=1024,  # two conversations of ~600 tokens do not fit: one goes to the host tier
        max_num_seqs=4,
        max_num_batched_tokens=256,
        n_threads=2,
        host_cache_mib=256,
        disk_cache_mib=256,
    )
    server = ServerConfig(shutdown_grace_s=2, state_dir=str(state))
    return Config(default="gemma-3-270m", models={"gemma-3-270m": model}, server=server)


def text(start: int, n: int) -> str:
    return " ".join(WORDS[start : start + n])  # one line: the transcript format's turns


def chat(served, user: str, messages: list[dict]) -> tuple[str, int, int]:
    """A greedy reply of at most 16 tokens: (its text, prompt tokens, cached tokens)."""
    body = {
        "user": user,
        "messages": messages,
        "max_tokens": 16,
        "temperature": 0,
    }
    request = urllib.request.Request(
        served.thread.http + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        reply = json.loads(response.read())
    usage = reply["usage"]
    content = reply["choices"][0]["message"]["content"]
    return content, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def tier_series(served, name: str, tier: str) -> float:
    with urllib.request.urlopen(served.thread.http + "/metrics", timeout=30) as response:
        metrics = response.read().decode()
    found = re.search(
        rf'^localserve:prefix_cache_tier_{name}{{[^}}]*tier="{tier}"[^}}]*}} (\S+)$',
        metrics,
        re.M,
    )
    assert found, f"no {tier} tier {name} series in /metrics"
    return float(found.group(1))


def tier_hits(served, tier: str) -> float:
    return tier_series(served, "hits_total", tier)


def all_written(served) -> bool:
    """Every state saved in host memory is on disk too (the writer is behind, at nice 19: on a
    busy machine a stop's last second would not always be enough for it)."""
    host = tier_series(served, "saved_total", "host")
    return host > 0 and tier_series(served, "saved_total", "disk") == host


def test_a_conversation_resumes_from_host_memory_and_after_a_restart_from_disk(tmp_path):
    from localserve.serve.serving import serving

    first = [{"role": "user", "content": text(0, 450) + " What is this about?"}]
    with serving(config(tmp_path), thread=True) as served:
        reply, _, _ = chat(served, "alice", first)
        chat(served, "carol", [{"role": "user", "content": text(600, 520)}])  # alice's cells go
        second = [*first, {"role": "assistant", "content": reply}]
        second.append({"role": "user", "content": "Say it in one line."})
        reply2, prompt, cached = chat(served, "alice", second)
        assert cached >= prompt - 40, (prompt, cached)  # all but the new turn, restored
        assert tier_hits(served, "host") >= 1
        _, prompt, cached = chat(served, "bob", second)  # the same words: not his prefix
        assert cached < 100, (prompt, cached)  # (the transcript's preamble is everyone's)
        wait_until(lambda: all_written(served), 120, "the disk tier's writes", interval=0.2)
    files = list((tmp_path / "kv-cache").rglob("*.kv"))
    assert files and all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    third = [*second, {"role": "assistant", "content": reply2}]
    third.append({"role": "user", "content": "And why?"})
    with serving(config(tmp_path), thread=True) as served:  # a restart: nothing in memory
        _, prompt, cached = chat(served, "alice", third)
        assert cached >= prompt - 60, (prompt, cached)
        assert tier_hits(served, "disk") == 1
        _, prompt, cached = chat(served, "dave", third)  # (bob has his own copy of `second`)
        assert cached < 100, (prompt, cached)
