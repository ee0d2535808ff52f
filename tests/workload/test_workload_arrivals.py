"""Arrival processes: rates, burstiness, closed loop, parsing and bad input."""

from __future__ import annotations

import random
import statistics

import pytest

from stepserve.workload import (
    ClosedLoop,
    Constant,
    Gamma,
    Poisson,
    WorkloadError,
    parse_arrival,
)


def gaps(process, n: int = 20_000, seed: int = 3) -> list[float]:
    times = process.times(n, random.Random(seed))
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def cv2(values: list[float]) -> float:
    mean = statistics.fmean(values)
    return statistics.pvariance(values) / (mean * mean)


def test_open_loop_times_start_at_zero_and_never_decrease():
    for process in (Poisson(5.0), Gamma(5.0, 0.5), Constant(2.0)):
        times = process.times(1000, random.Random(1))
        assert times[0] == 0.0
        assert all(a <= b for a, b in zip(times, times[1:], strict=False))
        assert process.closed_loop_concurrency is None


def test_poisson_mean_gap_is_one_over_rate():
    g = gaps(Poisson(5.0))
    assert statistics.fmean(g) == pytest.approx(1 / 5.0, rel=0.03)
    assert cv2(g) == pytest.approx(1.0, rel=0.08)  # exponential: CV^2 = 1


@pytest.mark.parametrize("shape", [0.25, 0.5, 1.0, 4.0])
def test_gamma_keeps_the_rate_and_sets_cv2_to_one_over_shape(shape):
    g = gaps(Gamma(5.0, shape))
    assert statistics.fmean(g) == pytest.approx(1 / 5.0, rel=0.05)
    assert cv2(g) == pytest.approx(1 / shape, rel=0.15)


def test_lower_burstiness_is_burstier():
    assert cv2(gaps(Gamma(5.0, 0.25))) > cv2(gaps(Gamma(5.0, 1.0))) > cv2(gaps(Gamma(5.0, 4.0)))


def test_constant_is_evenly_spaced():
    assert Constant(4.0).times(5, random.Random(0)) == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_closed_loop_has_concurrency_and_no_times():
    process = ClosedLoop(64)
    assert process.closed_loop_concurrency == 64
    assert process.times(3, random.Random(0)) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("data,expected", [
    ({"poisson": {"rate": 5.0}}, Poisson(5.0)),
    ({"gamma": {"rate": 5, "burstiness": 0.5}}, Gamma(5.0, 0.5)),
    ({"constant": {"rate": 2}}, Constant(2.0)),
    ({"closed_loop": {"concurrency": 64}}, ClosedLoop(64)),
    ({"batch": {"concurrency": 64}}, ClosedLoop(64)),
])
def test_parse_and_round_trip(data, expected):
    process = parse_arrival(data)
    assert process == expected
    assert parse_arrival(process.to_dict()) == process
    assert process.describe()


@pytest.mark.parametrize("data,message", [
    ({"poisson": {"rate": -1}},
     r"arrival\.poisson\.rate = -1: must be a finite number in \[1e-06, 1000000\]"),
    ({"poisson": {"rate": 0}},
     r"arrival\.poisson\.rate = 0: must be a finite number in \[1e-06, 1000000\]"),
    ({"poisson": {"rate": float("inf")}}, r"arrival\.poisson\.rate = inf"),
    ({"poisson": {"rate": "fast"}}, r"arrival\.poisson\.rate = 'fast'"),
    ({"poisson": 5}, r"arrival\.poisson = 5: must be a mapping with keys rate"),
    ({"poisson": {"rate": 1, "burst": 2}},
     r"arrival\.poisson: unknown key 'burst'; allowed keys: rate"),
    ({"gamma": {"rate": 5}}, r"arrival\.gamma: missing required key 'burstiness'"),
    ({"gamma": {"rate": 5, "burstiness": 0}}, r"arrival\.gamma\.burstiness = 0: must be"),
    ({"closed_loop": {"concurrency": 0}},
     r"arrival\.closed_loop\.concurrency = 0: must be an integer in \[1, 100000\]"),
    ({"closed_loop": {"concurrency": 2.5}}, r"arrival\.closed_loop\.concurrency = 2\.5"),
    ({"uniform": {"rate": 1}},
     r"arrival: unknown key 'uniform'; allowed keys: poisson, gamma, constant, closed_loop"),
    ({}, r"arrival = \{\}: must be a mapping with exactly one of"),
    ({"trace": 3}, r"arrival\.trace = 3: must be a non-empty string"),
])
def test_bad_arrivals_raise_clear_errors(data, message):
    with pytest.raises(WorkloadError, match=message):
        parse_arrival(data)
