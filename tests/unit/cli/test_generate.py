"""`localserve generate` (localserve/cli/generate.py): the timing line it prints after a reply."""

from __future__ import annotations

from localserve.cli import generate
from localserve.engine.events import Done


def done(**timings) -> Done:
    return Done("cli", "length", 5, 3, 0, timings)


class Info:
    model, backend, n_threads = "m", "cpu", 2


def test_the_timing_line_says_what_it_measured(capsys):
    generate._print_timings(Info, done(ttft_ms=12.4, itl_ms=4.0, e2e_ms=20.0), 0.5)
    line = capsys.readouterr().err.splitlines()[-1]
    assert line == "TTFT 12 ms, ITL 4.0 ms (250.0 tokens/s), total 0.50 s"


def test_the_timing_line_survives_a_missing_ttft(capsys):
    generate._print_timings(Info, done(queue_ms=None, ttft_ms=None, itl_ms=None, e2e_ms=None), 0.1)
    err = capsys.readouterr().err
    assert "finish=length prompt=5 tokens, generated=3 tokens" in err
    assert err.splitlines()[-1] == "TTFT – ms, ITL – ms (– tokens/s), total 0.10 s"
    generate._print_timings(Info, done(), 0.1)  # no timings at all
    assert "TTFT – ms" in capsys.readouterr().err
