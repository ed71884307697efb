"""`localserve bench-engine` (localserve/bench/engine.py, localserve/cli/bench_engine.py) on the
real model, shortened: the bare `llama_decode` loop and the engine side by side at one and two
sequences, written as JSON with the figures docs/benchmarks.md records."""

from __future__ import annotations

import json

import pytest

from localserve import cli

pytestmark = pytest.mark.model


def test_bench_engine_measures_the_engine_against_the_bare_loop(tmp_path, capsys):
    out = tmp_path / "engine.json"
    assert (
        cli.main(
            ["bench-engine", "--concurrency", "1,2", "--tokens", "4", "--prefill-tokens", "128"]
            + ["--out", str(out)]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert [row["concurrency"] for row in result["decode"]] == [1, 2]
    for row in result["decode"]:
        assert row["bare_tokens_per_s"] > 0 and row["ratio"] > 0
        assert row["engine"]["tokens_per_s"] > 0
    assert result["sampled"]["tokens_per_s"] > 0
    assert result["prefill"]["engine_tokens_per_s"] > 0
    assert "2 seqs: bare" in capsys.readouterr().out
