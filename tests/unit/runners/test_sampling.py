"""numpy sampling: the filters do what llama.cpp's do, seeded draws repeat."""

from __future__ import annotations

import numpy as np
import pytest

from localserve.engine.sampling_params import MAX_CANDIDATES, MIN_TEMPERATURE, SamplingParams
from localserve.runners.sampling import Sampler, SamplingError


def logits(n: int = 1000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=n).astype(np.float32)


def draws(params: SamplingParams, row: np.ndarray, n: int = 300) -> list[int]:
    sampler = Sampler(params)
    return [sampler.sample(row.copy()) for _ in range(n)]


def test_temperature_zero_is_argmax():
    row = logits()
    assert Sampler(SamplingParams(temperature=0)).sample(row) == int(row.argmax())


def test_ignore_eos_never_picks_an_end_of_generation_token():
    row = logits()
    row[7] = 100.0  # an EOG token the model is sure about
    params = SamplingParams(temperature=0, ignore_eos=True)
    assert Sampler(params, eog_ids=np.array([7])).sample(row) != 7


def test_top_k_one_is_argmax_at_any_temperature():
    row = logits()
    params = SamplingParams(temperature=5.0, top_k=1, top_p=1.0, min_p=0.0, seed=3)
    assert set(draws(params, row, 50)) == {int(row.argmax())}


def test_top_k_keeps_only_the_k_most_likely():
    row = logits()
    top5 = set(np.argsort(-row)[:5].tolist())
    params = SamplingParams(temperature=2.0, top_k=5, top_p=1.0, min_p=0.0, seed=1)
    seen = set(draws(params, row))
    assert seen <= top5 and len(seen) > 1


def test_min_p_drops_tokens_far_below_the_most_likely():
    row = np.full(100, -10.0, dtype=np.float32)
    row[:3] = [5.0, 4.5, 4.0]  # all others have p < 0.05 * p_max
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.05, seed=2)
    assert set(draws(params, row)) == {0, 1, 2}


def test_small_top_p_keeps_the_head_of_the_distribution():
    row = np.array([3.0, 2.9, -5.0, -6.0], dtype=np.float32)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0, seed=4)
    assert set(draws(params, row)) == {0}


def test_seeded_sampling_repeats_and_seeds_differ():
    row = logits()
    params = SamplingParams(temperature=1.0, top_k=40, seed=11)
    assert draws(params, row) == draws(params, row)
    other = SamplingParams(temperature=1.0, top_k=40, seed=12)
    assert draws(params, row) != draws(other, row)


def test_frequencies_follow_the_tempered_softmax():
    row = np.log(np.array([0.5, 0.3, 0.2], dtype=np.float32))
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5)
    counts = np.bincount(draws(params, row, 4000), minlength=3) / 4000
    assert np.allclose(counts, [0.5, 0.3, 0.2], atol=0.03)
    hot = SamplingParams(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0, seed=5)
    counts = np.bincount(draws(hot, row, 4000), minlength=3) / 4000
    expected = np.sqrt([0.5, 0.3, 0.2]) / np.sqrt([0.5, 0.3, 0.2]).sum()
    assert np.allclose(counts, expected, atol=0.03)


# --- hostile values and broken logits: one sequence's problem, raised as SamplingError ------


@pytest.mark.parametrize("temperature", [5e-324, 1e-320, 1e-38, 9.99e-6])
def test_a_temperature_below_the_minimum_is_argmax(temperature):
    row = logits() * 1e4  # large logits: divided by a tiny temperature they would overflow
    assert Sampler(SamplingParams(temperature=temperature)).sample(row) == int(row.argmax())


def test_the_smallest_temperature_never_overflows():
    row = logits() * 1e4
    params = SamplingParams(temperature=MIN_TEMPERATURE, top_k=0, top_p=1.0, min_p=0.0, seed=1)
    assert set(draws(params, row, 20)) == {int(row.argmax())}


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_non_finite_logits_raise_a_sampling_error(bad, temperature):
    row = logits()
    row[3] = bad
    with pytest.raises(SamplingError, match="not finite"):
        Sampler(SamplingParams(temperature=temperature, seed=1)).sample(row)


def test_a_row_of_nan_raises_a_sampling_error_with_every_filter_off():
    row = np.full(1000, np.nan, dtype=np.float32)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    with pytest.raises(SamplingError):
        Sampler(params).sample(row)


def test_a_draw_considers_at_most_max_candidates_tokens():
    """top_k 0 (or huge) and no min_p must not sort Gemma's whole vocabulary every token."""
    row = np.random.default_rng(0).normal(size=262_144).astype(np.float32)
    for top_k in (0, 1 << 30):
        sampler = Sampler(SamplingParams(top_k=top_k, min_p=0.0, top_p=0.99, seed=1))
        assert len(sampler._filter(row)) == MAX_CANDIDATES
