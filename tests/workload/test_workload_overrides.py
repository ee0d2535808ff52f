"""override_workload: one behaviour for count, seed, rate and concurrency, per arrival kind."""

from __future__ import annotations

import pytest

from stepserve.config.errors import UsageError
from stepserve.workload import (
    ClosedLoop,
    Constant,
    Gamma,
    Poisson,
    RequestClass,
    RequestSpec,
    TraceReplay,
    Workload,
    WorkloadError,
    fixed,
    get_workload,
)
from stepserve.workload.overrides import WorkloadOverrides, override_workload

CLASSES = (RequestClass("chat", 1.0, fixed(10), fixed(5)),)
TRACE = tuple(RequestSpec(i, i * 0.5, 10, 5, 5) for i in range(8))


def workload(arrival) -> Workload:
    classes = () if isinstance(arrival, TraceReplay) else CLASSES
    return Workload("w", classes, arrival, 8)


@pytest.mark.parametrize("arrival, expected", [
    (Poisson(2.0), Poisson(9.0)),
    (Gamma(2.0, 0.5), Gamma(9.0, 0.5)),  # the burstiness is kept
    (Constant(2.0), Constant(9.0)),
])
def test_rate_applies_to_every_open_loop_process(arrival, expected):
    assert override_workload(workload(arrival), WorkloadOverrides(rate=9.0)).arrival == expected


@pytest.mark.parametrize("arrival", [ClosedLoop(4), TraceReplay(TRACE, "t.jsonl"),
                                     TraceReplay(TRACE, "t.jsonl", concurrency=2)])
def test_a_rate_on_a_closed_loop_or_trace_is_a_usage_error(arrival):
    with pytest.raises(WorkloadError, match=r"rate = 9: workload w has .* no rate") as e:
        override_workload(workload(arrival), WorkloadOverrides(rate=9.0))
    assert isinstance(e.value, UsageError)


@pytest.mark.parametrize("arrival, expected", [
    (ClosedLoop(4), ClosedLoop(16)),
    (TraceReplay(TRACE, "t.jsonl", concurrency=2), TraceReplay(TRACE, "t.jsonl", 16)),
])
def test_concurrency_applies_to_closed_loops(arrival, expected):
    out = override_workload(workload(arrival), WorkloadOverrides(concurrency=16))
    assert out.arrival == expected and out.closed_loop_concurrency == 16


@pytest.mark.parametrize("arrival", [Poisson(2.0), Gamma(2.0, 0.5), Constant(2.0),
                                     TraceReplay(TRACE, "t.jsonl")])
def test_concurrency_on_open_loop_arrivals_is_a_usage_error(arrival):
    with pytest.raises(WorkloadError, match="concurrency = 16: .*open loop"):
        override_workload(workload(arrival), WorkloadOverrides(concurrency=16))


@pytest.mark.parametrize("arrival", [Poisson(2.0), Gamma(2.0, 0.5), Constant(2.0),
                                     ClosedLoop(4), TraceReplay(TRACE, "t.jsonl")])
def test_count_seed_and_duration_apply_to_every_kind(arrival):
    out = override_workload(workload(arrival),
                            WorkloadOverrides(num_requests=3, seed=7, duration_s=60.0))
    assert (out.num_requests, out.seed, out.duration_s) == (3, 7, 60.0)
    assert out.arrival == arrival and len(out.generate()) == 3


def test_values_are_checked_by_the_workload():
    with pytest.raises(WorkloadError, match="poisson.rate = nan"):
        override_workload(workload(Poisson(2.0)), WorkloadOverrides(rate=float("nan")))
    with pytest.raises(WorkloadError, match="trace 't.jsonl' holds only 8"):
        override_workload(workload(TraceReplay(TRACE, "t.jsonl")),
                          WorkloadOverrides(num_requests=9))


def test_arrival_replaces_the_process_then_rate_applies_to_it():
    closed = workload(ClosedLoop(4))
    assert override_workload(closed, WorkloadOverrides(arrival=Poisson(3.0))).arrival \
        == Poisson(3.0)
    both = WorkloadOverrides(arrival=Gamma(1.0, 0.25), rate=5.0)
    assert override_workload(closed, both).arrival == Gamma(5.0, 0.25)


def test_no_overrides_is_the_same_workload():
    w = workload(Poisson(2.0))
    assert override_workload(w, WorkloadOverrides()) is w


def test_merged_later_values_win_and_unset_ones_keep():
    defaults = WorkloadOverrides(rate=6.0, num_requests=100)
    merged = defaults.merged(WorkloadOverrides(num_requests=40, seed=3))
    assert merged == WorkloadOverrides(num_requests=40, seed=3, rate=6.0)


def test_overriding_a_built_in_workload_matches_building_it_with_the_options():
    for name, overrides in (("quickstart", dict(num_requests=50, seed=2, rate=24.0)),
                            ("night-report", dict(num_requests=64, concurrency=16))):
        built = get_workload(name, **overrides)
        overridden = override_workload(get_workload(name), WorkloadOverrides(**overrides))
        assert overridden == built and overridden.generate() == built.generate()
