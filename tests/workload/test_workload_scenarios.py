"""Built-in scenarios carry the incidents' numbers."""

from __future__ import annotations

import random
import statistics
from collections import Counter

import pytest

from stepserve.workload import WorkloadError, get_workload, list_workloads
from stepserve.workload.arrivals import JobRounds, RateSchedule


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_every_scenario_builds_generates_and_explains_itself():
    assert list_workloads() == ["night-report", "mixed-pool", "promo-spike",
                                "promo-spike-closed", "quickstart"]
    for name in list_workloads():
        w = get_workload(name, num_requests=100)
        assert w.name == name and w.description
        assert len(w.generate()) == 100


def test_night_report_is_the_incidents_exact_64_way_mix():
    w = get_workload("night-report")
    assert w.closed_loop_concurrency == 64 and w.num_requests == 6400
    specs = w.generate()
    # every round of 64: 54 short then 10 long, exactly (nothing drawn: any seed alike)
    for start in range(0, len(specs), 64):
        outputs = [s.output_len for s in specs[start:start + 64]]
        assert outputs == [20] * 54 + [2000] * 10
    assert [s.index for s in specs] == list(range(6400))
    assert {s.request_class for s in specs if s.output_len == 2000} == {"long"}
    assert all(s.prompt_len == 128 and s.max_tokens == s.output_len for s in specs)
    outputs = [s.output_len for s in specs]
    assert percentile(outputs, 0.50) == 20 and percentile(outputs, 0.99) == 2000
    assert get_workload("night-report", seed=3).generate() == specs


def test_job_rounds_and_rate_schedules_check_their_shapes():
    with pytest.raises(WorkloadError, match=r"rounds.groups\[1\].output = 0"):
        JobRounds(groups=(("a", 1, 8, 4), ("b", 1, 8, 0)))
    with pytest.raises(WorkloadError, match="names must be unique"):
        JobRounds(groups=(("a", 1, 8, 4), ("a", 1, 8, 4)))
    with pytest.raises(WorkloadError, match="the schedule starts at 0"):
        RateSchedule(((5.0, 1.0),))
    with pytest.raises(WorkloadError, match="must be after the point before"):
        RateSchedule(((0.0, 1.0), (10.0, 2.0), (10.0, 3.0)))
    with pytest.raises(WorkloadError, match="must be > 0"):
        RateSchedule(((0.0, 1.0), (10.0, 0.0)))


def test_a_rate_schedule_follows_its_curve():
    ramp = RateSchedule(((0.0, 10.0), (60.0, 10.0), (120.0, 30.0)))
    assert ramp.rate_at(30) == 10 and ramp.rate_at(90) == 20 and ramp.rate_at(500) == 30
    times = ramp.times(20_000, random.Random(1))
    assert times[0] == 0.0 and times == sorted(times)
    per_window = Counter(int(t // 60) for t in times)
    assert per_window[0] == pytest.approx(600, rel=0.1)  # 10/s for the first minute
    assert per_window[1] == pytest.approx(1200, rel=0.1)  # rising 10 -> 30: 20/s on average
    assert per_window[3] == pytest.approx(1800, rel=0.1)  # 30/s after the ramp


def test_night_report_scales():
    w = get_workload("night_report", num_requests=640, concurrency=32)
    assert (w.num_requests, w.closed_loop_concurrency) == (640, 32)


def test_mixed_pool_is_30_percent_8k_summaries():
    w = get_workload("mixed-pool")
    assert w.shares == pytest.approx({"summary": 0.3, "chat": 0.7})
    specs = get_workload("mixed-pool", num_requests=10_000).generate()
    summaries = [s for s in specs if s.request_class == "summary"]
    assert len(summaries) / len(specs) == pytest.approx(0.3, abs=0.015)
    assert {s.prompt_len for s in summaries} == {8192}
    assert statistics.mean(s.output_len for s in summaries) == pytest.approx(200, rel=0.03)
    chats = [s.prompt_len for s in specs if s.request_class == "chat"]
    assert percentile(chats, 0.5) == pytest.approx(300, rel=0.05)
    assert get_workload("mixed-pool").arrival.rate_per_s == 0.8
    assert get_workload("mixed-pool", rate=3.0).arrival.rate_per_s == 3.0


def test_promo_spike_is_the_evenings_traffic():
    w = get_workload("promo-spike", num_requests=20_000)
    # 660 req/min at 20:00, 980/min from 20:01 on
    assert w.arrival.rate_at(0) * 60 == pytest.approx(660)
    assert w.arrival.rate_at(60) * 60 == pytest.approx(980)
    assert w.arrival.rate_at(3600) * 60 == pytest.approx(980)
    specs = w.generate()
    outputs = [s.output_len for s in specs]
    assert statistics.mean(outputs) == pytest.approx(280, rel=0.05)
    over = [s for s in specs if s.output_len > 1200]
    assert len(over) / len(specs) == pytest.approx(0.06, abs=0.005)
    assert {s.request_class for s in over} == {"long"}  # `long` is exactly "over 1,200"
    assert all(s.prompt_len + s.max_tokens <= 4096 for s in specs)
    assert percentile([s.prompt_len for s in specs], 0.5) == pytest.approx(580, rel=0.05)
    peak = [s for s in specs if s.arrival_s >= 60]
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(peak, peak[1:], strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(60 / 980, rel=0.03)
    first_minute = [s for s in specs if s.arrival_s < 60]
    assert len(first_minute) == pytest.approx(60 * (11 + 980 / 60) / 2, rel=0.1)
    # the default: the first five minutes from 20:00
    assert get_workload("promo-spike").generate()[-1].arrival_s == pytest.approx(300, rel=0.03)


def test_promo_spike_closed_is_140_users_with_the_same_mix():
    closed = get_workload("promo-spike-closed", num_requests=500)
    assert closed.closed_loop_concurrency == 140
    assert closed.classes == get_workload("promo-spike").classes


def test_quickstart_fits_a_4k_model():
    w = get_workload("quickstart")
    assert w.arrival.rate_per_s == 8.0  # below config A's knee (sim/scenarios.py)
    specs = w.generate()
    assert len(specs) == 1200
    assert all(s.prompt_len + s.max_tokens <= 4096 for s in specs)
    assert Counter(s.request_class for s in specs)["document"] / 1200 == pytest.approx(0.2,
                                                                                     abs=0.04)


def test_unknown_scenario_or_option():
    with pytest.raises(WorkloadError, match="workload = 'nightly': unknown; built-in "
                                            "workloads: night-report, mixed-pool"):
        get_workload("nightly")
    with pytest.raises(WorkloadError, match="night-report: unknown option 'rate'; allowed: "
                                            "num_requests, seed, concurrency"):
        get_workload("night-report", rate=5)
    with pytest.raises(WorkloadError, match=r"poisson\.rate = -1: must be"):
        get_workload("mixed-pool", rate=-1)
