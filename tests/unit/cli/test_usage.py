"""`localserve usage` (localserve/cli/usage.py): the report per day and user, read from the
usage record's database."""

from __future__ import annotations

import json
import time

from localserve.cli import main
from localserve.config import ServerConfig
from localserve.ops import quotas
from localserve.ops.usage import Usage
from tests.support.usage import recorded, row


def test_report_per_day_and_user(tmp_path, capsys):
    store = Usage(ServerConfig(state_dir=str(tmp_path)), "fake")
    now = time.time()
    yesterday = quotas.local_day_start(now) - 3600
    recorded(
        store,
        row("ann", t=yesterday, ttft=50.0),
        row("ann", ttft=100.0),
        row("ann", ttft=300.0),
        row("ann", ttft=200.0),
        row("bo", prompt=20, cached=0, completion=7, ttft=None),
    )
    store.close()
    state = ["--state-dir", str(tmp_path)]
    assert main(["usage", *state, "--json"]) == 0
    today = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(d["user"], d["requests"]) for d in today] == [("ann", 3), ("bo", 1)]
    assert today[0]["median_ttft_ms"] == 200.0 and today[1]["median_ttft_ms"] is None
    assert today[0]["cached_share"] == 0.4 and today[0]["completion_tokens"] == 15
    assert main(["usage", *state, "--since", "2d", "--user", "ann"]) == 0
    text = capsys.readouterr().out
    assert text.count("ann") == 2 and "bo" not in text and "median TTFT" in text
    assert "200 ms" in text and "40%" in text
    assert main(["usage", *state, "--since", "nonsense"]) == 2
    assert "expected today, 7d" in capsys.readouterr().err


def test_a_model_column_and_each_models_total(tmp_path, capsys):
    store = Usage(ServerConfig(state_dir=str(tmp_path)), "fake")
    recorded(
        store,
        row("ann", model="gemma", prompt=10, completion=5, ttft=100.0),
        row("ann", model="qwen", prompt=30, cached=0, completion=20, ttft=300.0),
        row("ann", model="qwen", prompt=10, cached=0, completion=10, ttft=500.0),
        row("bo", model="gemma", prompt=20, cached=0, completion=7, ttft=None),
    )
    store.close()
    state = ["--state-dir", str(tmp_path)]
    assert main(["usage", *state, "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(d["user"], d["model"], d["requests"]) for d in lines] == [
        ("ann", "gemma", 1),
        ("ann", "qwen", 2),
        ("bo", "gemma", 1),
    ]
    assert main(["usage", *state]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].split() == [
        "day", "user", "model", "requests", "tokens", "in", "cached", "tokens", "out", "median",
        "TTFT",
    ]  # fmt: skip
    assert text[2].split()[1:] == ["ann", "qwen", "2", "40", "0%", "30", "400", "ms"]
    totals = text[text.index("per model, the whole period:") + 2 :]
    assert [line.split() for line in totals] == [
        ["gemma", "2", "30", "13%", "12", "100", "ms"],
        ["qwen", "2", "40", "0%", "30", "400", "ms"],
    ]
    assert main(["usage", *state, "--user", "bo"]) == 0  # one model: no totals to repeat it
    assert "per model" not in capsys.readouterr().out
