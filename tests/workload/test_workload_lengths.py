"""Length distributions: sampling statistics, parsing, and every bad input."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from stepserve.workload import (
    Empirical,
    Fixed,
    LogNormal,
    Mixture,
    Uniform,
    WorkloadError,
    empirical,
    fixed,
    lognormal,
    mixture,
    parse_length,
    uniform,
)


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def draw(dist, n: int, seed: int = 7) -> list[int]:
    rng = random.Random(seed)
    return [dist.sample(rng) for _ in range(n)]


def test_fixed_and_uniform():
    assert draw(fixed(20), 100) == [20] * 100
    values = draw(uniform(10, 50), 10_000)
    assert min(values) == 10 and max(values) == 50  # both ends included
    assert statistics.mean(values) == pytest.approx(uniform(10, 50).mean(), rel=0.02)


@pytest.mark.parametrize("p50,p99", [(20, 2000), (300, 900)])
def test_lognormal_hits_its_percentiles(p50, p99):
    dist = lognormal(p50, p99)
    assert dist.mu == pytest.approx(math.log(p50))
    assert dist.sigma == pytest.approx((math.log(p99) - math.log(p50)) / 2.3263, rel=1e-4)
    values = draw(dist, 20_000)
    assert percentile(values, 0.50) == pytest.approx(p50, rel=0.05)
    assert percentile(values, 0.99) == pytest.approx(p99, rel=0.12)
    assert statistics.mean(values) == pytest.approx(dist.mean(), rel=0.08)


def test_lognormal_clip_and_clipped_mean():
    dist = lognormal(20, 2000, max=500)
    values = draw(dist, 20_000)
    assert max(values) == 500 and min(values) >= 1
    assert dist.mean() < lognormal(20, 2000).mean()
    assert statistics.mean(values) == pytest.approx(dist.mean(), rel=0.05)


def test_mixture_weights_and_mean():
    dist = mixture([(0.85, fixed(20)), (0.15, fixed(2000))])
    values = draw(dist, 10_000)
    assert set(values) == {20, 2000}
    assert values.count(2000) / len(values) == pytest.approx(0.15, abs=0.015)
    assert dist.mean() == pytest.approx(0.85 * 20 + 0.15 * 2000)
    # weights are relative: 54:10 is the same as 54/64:10/64
    assert Mixture(((54, fixed(20)), (10, fixed(2000)))).weights == pytest.approx((54 / 64, 10 / 64))


def test_empirical_from_values_and_file(tmp_path):
    dist = empirical([1, 2, 3])
    assert set(draw(dist, 1000)) == {1, 2, 3}
    assert dist.mean() == 2.0
    path = tmp_path / "lengths.txt"
    path.write_text("# output lengths\n5\n\n7\n")
    from_file = empirical(path)
    assert from_file.values == (5, 7) and from_file.source == str(path)
    assert parse_length({"empirical": {"file": "lengths.txt"}}, base_dir=tmp_path) == from_file


def test_empirical_file_errors_name_the_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("5\nseven\n")
    with pytest.raises(WorkloadError, match="line 2 = 'seven'"):
        empirical(path)
    path.write_text("5\n0\n")
    with pytest.raises(WorkloadError, match=r"line 2 = 0: must be an integer in \[1, 1048576\]"):
        empirical(path)
    with pytest.raises(WorkloadError, match="cannot be read"):
        empirical(tmp_path / "missing.txt")


@pytest.mark.parametrize("data,expected", [
    ({"fixed": 20}, Fixed(20)),
    (20, Fixed(20)),
    ({"uniform": [10, 50]}, Uniform(10, 50)),
    ({"lognormal": {"p50": 20, "p99": 2000, "max": 4096}}, LogNormal(20, 2000, 4096)),
    ({"mixture": [{"weight": 0.85, "fixed": 20}, {"weight": 0.15, "fixed": 2000}]},
     Mixture(((0.85, Fixed(20)), (0.15, Fixed(2000))))),
    ({"empirical": [1, 2, 3]}, Empirical((1, 2, 3))),
])
def test_parse_and_round_trip(data, expected):
    dist = parse_length(data)
    assert dist == expected
    assert parse_length(dist.to_dict()) == dist
    assert dist.describe()


@pytest.mark.parametrize("data,message", [
    ({"fixed": 0}, r"output\.fixed = 0: must be an integer in \[1, 1048576\]"),
    ({"fixed": 2.5}, r"output\.fixed = 2\.5: must be an integer"),
    ({"fixed": True}, r"output\.fixed = True: must be an integer"),
    ({"uniform": [50, 10]}, r"output\.uniform\.hi = 10: must be >= uniform\.lo = 50"),
    ({"uniform": 5}, r"output\.uniform = 5: must be \[lo, hi\]"),
    ({"lognormal": {"p50": 200, "p99": 20}},
     r"output\.lognormal\.p99 = 20: must be >= lognormal\.p50 = 200"),
    ({"lognormal": {"p50": -1, "p99": 20}}, r"output\.lognormal\.p50 = -1: must be a finite"),
    ({"lognormal": {"p50": 0.5, "p99": 20}}, r"output\.lognormal\.p50 = 0\.5: must be >= 1"),
    ({"lognormal": {"p50": 20, "p99": 1e300}}, r"output\.lognormal\.p99 = 1e\+300: must be <="),
    ({"lognormal": {"p50": 20}}, r"output\.lognormal: missing required key 'p99'"),
    ({"lognormal": {"p50": 20, "p99": 30, "p90": 25}},
     r"output\.lognormal: unknown key 'p90'; allowed keys: p50, p99, max"),
    ({"lognormal": {"p50": 200, "p99": 300, "max": 100}}, r"output\.lognormal\.max = 100"),
    ({"mixture": []}, r"output\.mixture = \[\]: must be a non-empty list"),
    ({"mixture": [{"fixed": 20}]}, r"output\.mixture\[0\] = .*'weight'"),
    ({"mixture": [{"weight": 0, "fixed": 20}]}, r"output\.mixture\[0\]\.weight = 0: must be"),
    ({"mixture": [{"weight": 1, "fixd": 20}]},
     r"output\.mixture\[0\]: unknown key 'fixd'; allowed keys: fixed, uniform"),
    ({"empirical": []}, r"output\.empirical = \[\]: must be a non-empty list"),
    ({"empirical": [3, 0]}, r"output\.empirical\[1\] = 0: must be an integer in \[1, 1048576\]"),
    ({"normal": 3}, r"output: unknown key 'normal'; allowed keys: fixed, uniform, lognormal"),
    ({"fixed": 1, "uniform": [1, 2]}, r"output = .*: must be a mapping with exactly one of"),
    ("long", r"output = 'long': must be a mapping with exactly one of"),
])
def test_bad_lengths_raise_clear_errors(data, message):
    with pytest.raises(WorkloadError, match=message):
        parse_length(data, "output")


def test_constructors_validate_too():
    with pytest.raises(WorkloadError, match="mixture = \\(\\): must list at least one"):
        Mixture(())
    with pytest.raises(WorkloadError, match=r"mixture\[0\] = .*\(weight, length distribution\)"):
        mixture([(1.0, 20)])
    with pytest.raises(WorkloadError, match="lognormal.p99 = 10: must be >= lognormal.p50 = 20"):
        lognormal(20, 10)
