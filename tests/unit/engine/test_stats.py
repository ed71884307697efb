"""The summary statistics shared by the metrics and the load generator."""

from __future__ import annotations

import numpy as np
import pytest

from localserve.engine.stats import percentile


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy(q):
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.3]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_of_nothing_is_none():
    assert percentile([], 50) is None


def test_percentile_of_one_value_is_that_value():
    assert percentile([4.2], 99) == 4.2
