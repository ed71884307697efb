"""The online step-cost model and the adaptive prefill budget (localserve/engine/budget.py)."""

from __future__ import annotations

import math
import random

import pytest

from localserve.engine.budget import MAX_TRACE, PRIOR, DraftRowCost, StepCostModel

# a synthetic machine: step time = A + B * decode tokens + C * prefill tokens (seconds)
A, B, C = 0.020, 0.003, 0.0005


def true_step_s(num_decode: int, num_prefill: int) -> float:
    return A + B * num_decode + C * num_prefill


def mixed_steps(n: int, seed: int = 0) -> list[tuple[int, int]]:
    """(decode, prefill) pairs: a third of the steps carry a prefill chunk, some without decodes."""
    rng = random.Random(seed)
    steps = []
    for _ in range(n):
        num_decode = rng.randint(0, 16)
        num_prefill = rng.randint(16, 512) if rng.random() < 1 / 3 else 0
        steps.append((num_decode, num_prefill))
    return steps


def trained(steps: list[tuple[int, int]], noise: float = 0.0, seed: int = 0) -> StepCostModel:
    rng = random.Random(seed)
    model = StepCostModel()
    for num_decode, num_prefill in steps:
        jitter = 1 + rng.uniform(-noise, noise)
        model.update(num_decode, num_prefill, true_step_s(num_decode, num_prefill) * jitter)
    return model


def is_finite(model: StepCostModel) -> bool:
    values = list(model.theta) + [v for row in model._p for v in row]
    return all(math.isfinite(v) for v in values)


# --- the fit ---------------------------------------------------------------------------------


def test_untrained_model_predicts_from_the_prior():
    model = StepCostModel()
    assert model.theta == list(PRIOR)
    assert model.predict(2, 10) == pytest.approx(PRIOR[0] + 2 * PRIOR[1] + 10 * PRIOR[2])


@pytest.mark.parametrize("noise", [0.0, 0.02])
def test_model_learns_a_linear_step_time_law(noise):
    model = trained(mixed_steps(300), noise=noise)
    assert model.theta == pytest.approx([A, B, C], rel=0.10)
    assert model.num_updates == 300
    for num_decode, num_prefill in [(0, 512), (8, 0), (16, 128)]:
        expected = true_step_s(num_decode, num_prefill)
        assert model.predict(num_decode, num_prefill) == pytest.approx(expected, rel=0.05)


def test_model_follows_a_change_of_machine_speed():
    model = trained(mixed_steps(200))
    for num_decode, num_prefill in mixed_steps(200, seed=2):  # the machine is now 2x slower
        model.update(num_decode, num_prefill, 2 * true_step_s(num_decode, num_prefill))
    assert model.theta == pytest.approx([2 * A, 2 * B, 2 * C], rel=0.10)


def test_prediction_is_never_negative():
    model = StepCostModel(prior=(-1.0, 0.0, 0.0))
    assert model.predict(0, 0) == 0.0


@pytest.mark.parametrize("num_decode", [None, 1, 8])
def test_long_decode_only_run_keeps_the_model_finite(num_decode):
    rng = random.Random(3)
    model = StepCostModel()
    for _ in range(10_000):
        d = num_decode if num_decode is not None else rng.randint(1, 16)
        model.update(d, 0, true_step_s(d, 0))
    assert is_finite(model)
    assert sum(row[i] for i, row in enumerate(model._p)) <= MAX_TRACE * (1 + 1e-9)
    d = num_decode or 8
    assert model.predict(d, 0) == pytest.approx(true_step_s(d, 0), rel=0.01)
    budget = model.prefill_budget(d, target_s=0.12, floor=32, ceiling=512)
    assert 32 <= budget <= 512


def test_prefill_token_cost_stays_positive():
    model = StepCostModel(prior=(0.01, 0.001, -0.5))
    assert model.prefill_token_s > 0
    assert model.prefill_budget(0, target_s=0.1, floor=1, ceiling=10**9) < 10**9


# --- the budget ------------------------------------------------------------------------------

# 10 ms per step, 2 ms per decode token, 0.1 ms per prefill token
SIMPLE = (0.010, 0.002, 0.0001)


def test_budget_fills_the_spare_time_of_the_step():
    model = StepCostModel(prior=SIMPLE)
    # spare = 0.1 - (0.01 + 20 * 0.002) = 0.05 s -> 500 tokens at 0.1 ms
    assert model.prefill_budget(20, target_s=0.1, floor=16, ceiling=4096) == pytest.approx(
        500, abs=1
    )


def test_budget_never_exceeds_the_ceiling():
    model = StepCostModel(prior=SIMPLE)
    assert model.prefill_budget(0, target_s=0.1, floor=16, ceiling=512) == 512


def test_budget_never_drops_below_the_floor():
    model = StepCostModel(prior=SIMPLE)
    assert model.prefill_budget(40, target_s=0.1, floor=16, ceiling=512) == pytest.approx(
        100, abs=1
    )
    assert model.prefill_budget(45, target_s=0.1, floor=16, ceiling=512) == 16  # no spare time
    assert model.prefill_budget(200, target_s=0.1, floor=16, ceiling=512) == 16


def test_ceiling_wins_over_a_larger_floor():
    model = StepCostModel(prior=SIMPLE)
    assert model.prefill_budget(200, target_s=0.1, floor=64, ceiling=32) == 32


def test_budget_shrinks_as_decodes_grow():
    model = StepCostModel(prior=SIMPLE)
    budgets = [model.prefill_budget(d, 0.1, floor=16, ceiling=4096) for d in range(0, 60, 5)]
    assert budgets == sorted(budgets, reverse=True)
    assert budgets[0] > budgets[5] > budgets[-1] == 16


def test_learned_budget_keeps_the_predicted_step_within_target():
    model = trained(mixed_steps(300))
    target = 0.12
    for num_decode in (0, 4, 16):
        budget = model.prefill_budget(num_decode, target, floor=32, ceiling=8192)
        assert true_step_s(num_decode, budget) <= target * 1.05
        assert true_step_s(num_decode, budget + 20) > target  # and uses most of the time


def test_prefill_price_is_not_absorbed_by_the_intercept():
    # a long paste: every step carries the same small chunk, so a joint fit could not tell the
    # fixed cost from the prefill cost; the decode part was learned before the paste arrived
    model = StepCostModel()
    for _ in range(50):
        model.update(1, 0, true_step_s(1, 0))
    for _ in range(200):
        model.update(1, 32, true_step_s(1, 32))
    assert model.predict(1, 0) == pytest.approx(true_step_s(1, 0), rel=0.05)
    assert model.prefill_token_s == pytest.approx(C, rel=0.05)


def test_prefill_price_follows_deeper_context():
    model = trained(mixed_steps(300))
    for _ in range(30):  # chunks deeper in a long prompt cost twice as much per token
        model.update(2, 64, true_step_s(2, 0) + 2 * C * 64)
    assert model.prefill_s(2, 64) / 64 == pytest.approx(2 * C, rel=0.05)


def test_a_gpu_is_priced_by_its_own_steps_not_the_cpu_prior():
    """On a GPU a step of 16 decodes and 512 prompt tokens takes a few ms: after one decode-only
    and one mixed step, the whole batch is prompt budget (the CPU prior no longer counts)."""
    model = StepCostModel()
    assert model.prefill_budget(16, 0.120, 32, 512) < 100  # the CPU prior: 16 decodes cost 74 ms
    model.update(16, 0, 0.003)
    model.update(16, 496, 0.003 + 496 * 10e-6)
    assert model.prefill_budget(16, 0.120, 32, 512) == 512


def cliff_step_s(num_decode: int, num_prefill: int) -> float:
    """A machine whose batches of 64 tokens or more take a slower path (as llama.cpp's CPU flash
    attention did here): 3 decodes + 60 prompt tokens fit 0.12 s, 3 + 61 do not."""
    slow = 0.035 + 0.0002 * num_prefill if num_decode + num_prefill >= 64 else 0.0
    return true_step_s(num_decode, 0) + 0.0012 * num_prefill * (num_prefill > 0) + slow


def cliff_model() -> StepCostModel:
    model = StepCostModel()
    for d in (1, 2, 3, 4) * 5:
        model.update(d, 0, cliff_step_s(d, 0))
    return model


def prefill_with_streams(model: StepCostModel, target: float, steps: int) -> list[tuple]:
    """(chunk, step seconds) of `steps` steps of three streams and a long prompt."""
    record = []
    for _ in range(steps):
        chunk = model.prefill_budget(3, target, floor=8, ceiling=509)
        step_s = cliff_step_s(3, chunk)
        model.update(3, chunk, step_s)
        record.append((chunk, step_s))
    return record


def test_the_budget_learns_a_batch_size_where_tokens_get_dearer_and_stays_below_it():
    record = prefill_with_streams(cliff_model(), 0.12, 40)
    # a few steps find the dear sizes; then every step stays below them, within the target
    assert max(step_s for _, step_s in record[10:]) <= 0.12
    assert {chunk for chunk, _ in record[10:]} <= set(range(52, 61))


def test_a_smaller_chunk_that_advances_the_prompt_faster_wins():
    model = cliff_model()
    for chunk in (50, 96, 50, 96):  # both sides of the cliff seen
        model.update(3, chunk, cliff_step_s(3, chunk))
    # 97 tokens would fit 0.20 s, but 60 in 0.10 s advance the prompt faster (and the streams);
    # the sizes between, not seen yet, are tried once each (priced like the nearest smaller one)
    record = prefill_with_streams(model, 0.20, 20)
    assert max(step_s for _, step_s in record) <= 0.20
    assert {chunk for chunk, _ in record[10:]} <= set(range(55, 61))


def test_one_price_for_every_size_still_takes_the_largest_chunk_that_fits():
    model = StepCostModel(prior=SIMPLE)
    for chunk in (40, 100, 300):  # measured at several sizes, all at the same price
        model.update(20, chunk, 0.010 + 20 * 0.002 + 0.0001 * chunk)
    assert model.prefill_budget(20, target_s=0.1, floor=16, ceiling=4096) == pytest.approx(
        500, abs=1
    )


def test_a_prediction_is_measured_once_a_step_of_its_kind_was():
    model = StepCostModel()
    assert not model.is_measured(2, 0) and not model.is_measured(0, 256)
    model.update(2, 0, 0.05)
    assert model.is_measured(2, 0) and not model.is_measured(2, 256)
    model.update(2, 64, 0.3)
    assert model.is_measured(0, 256) and model.is_measured(3, 4)
    prefill_only = StepCostModel()
    prefill_only.update(0, 64, 0.3)  # a decode step's prediction is still the prior's
    assert prefill_only.is_measured(0, 256) and not prefill_only.is_measured(2, 0)


def test_draft_rows_are_priced_apart_a_fixed_part_and_a_price_per_row():
    # this CPU's shape (docs/benchmarks.md): one sequence, 11 ms; +13 ms with one draft row (a
    # one-row step becomes a matrix product), then 3 ms a row
    def extra(n):
        return 0.013 + 0.003 * n

    cost = DraftRowCost()
    assert cost.row_s(0.004) == 0.004 and cost.extra_s(0, 0.004) == 0.0  # before any
    rng = random.Random(1)
    for _ in range(10):  # probes first: they teach the fixed part, not the per-row price
        cost.update(1, extra(1), 0.004)
    assert cost.fixed_s > 0.008 and abs(cost.row_s(0.004) - 0.004) < 0.0005
    for _ in range(60):
        n = rng.choice([4, 8, 16, 32, 48])
        cost.update(n, extra(n) * rng.uniform(0.95, 1.05), 0.004)
    assert abs(cost.row_s(0.004) - 0.003) < 0.0005
    assert abs(cost.fixed_s - 0.013) < 0.004
    assert abs(cost.extra_s(48, 0.004) - extra(48)) < 0.01
