"""The steps against this machine's own best (localserve.engine.slowdown): a machine doing other
work makes every shape of step slower; a heavier load is other shapes, not a slowdown."""

from __future__ import annotations

from localserve.engine.slowdown import SPAN_S, Slowdown


def steps(s: Slowdown, t0: float, n: int, shapes: list[tuple[int, int]], cost) -> float:
    t = t0
    for i in range(n):
        decode, prefill = shapes[i % len(shapes)]
        step_s = cost(decode, prefill)
        s.add(t, decode, prefill, step_s)
        t += step_s
    return t


def quiet(decode: int, prefill: int) -> float:
    return 0.010 + 0.002 * decode + 0.001 * prefill


def test_a_quiet_machine_reads_as_its_own_pace_whatever_the_load():
    s = Slowdown()
    assert s.ratio is None
    t = steps(s, 0.0, 100, [(1, 0), (2, 0), (3, 64)], quiet)
    assert s.ratio == 1.0
    steps(s, t, 100, [(12, 0), (14, 256), (16, 0)], quiet)  # more users: other shapes
    assert s.ratio == 1.0


def test_a_busy_machine_reads_as_slower_than_its_best():
    s = Slowdown()
    t = steps(s, 0.0, 100, [(2, 0), (3, 0), (3, 64)], quiet)
    steps(s, t, 64, [(2, 0), (3, 0), (3, 64)], lambda d, p: 2.2 * quiet(d, p))
    assert 2.1 < s.ratio < 2.3


def test_the_best_is_forgotten_after_its_span():
    # a machine slower for good: after SPAN_S its slow steps are the best it does
    s = Slowdown()
    t = steps(s, 0.0, 50, [(2, 0)], quiet)
    t = steps(s, t + SPAN_S, 50, [(2, 0)], lambda d, p: 2 * quiet(d, p))
    assert s.ratio == 1.0
