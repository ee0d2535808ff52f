"""percentile() agrees with numpy's default linear interpolation."""

import random

import pytest

from stepserve.metrics.percentiles import least_squares_slope, mean, percentile, ratio


@pytest.mark.parametrize("values, p, expected", [
    ([1, 2, 3, 4], 50, 2.5),
    ([1, 2, 3, 4], 25, 1.75),
    ([1, 2, 3, 4], 0, 1),
    ([1, 2, 3, 4], 100, 4),
    ([10, 7, 4, 3, 2, 1], 50, 3.5),  # numpy.percentile's docstring example, flattened
    (list(range(1, 101)), 99, 99.01),
    (list(range(1, 101)), 95, 95.05),
    ([5.0], 99, 5.0),
    ([3, 1, 2], 50, 2),  # order of the input does not matter
])
def test_percentile_known_values(values, p, expected):
    assert percentile(values, p) == pytest.approx(expected)


def test_percentile_of_nothing_is_none():
    assert percentile([], 50) is None


@pytest.mark.parametrize("p", [-1, 100.5, float("nan")])
def test_percentile_rejects_p_outside_0_100(p):
    with pytest.raises(ValueError, match="must be in"):
        percentile([1, 2], p)


def test_percentile_matches_numpy_on_random_lists():
    np = pytest.importorskip("numpy")
    rng = random.Random(7)
    for _ in range(200):
        values = [rng.expovariate(1.0) for _ in range(rng.randint(1, 40))]
        for p in (0, 1, 50, 90, 95, 99, 99.9, 100):
            assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)))


def test_mean_ratio_and_slope():
    assert mean([]) is None
    assert mean([1, 2, 6]) == 3
    assert ratio(1, 0) is None and ratio(None, 2) is None and ratio(1, 4) == 0.25
    assert least_squares_slope([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx(2.0)
    assert least_squares_slope([1], [1]) is None
    assert least_squares_slope([2, 2], [1, 5]) is None  # no spread in x
    with pytest.raises(ValueError):
        least_squares_slope([1, 2], [1])
