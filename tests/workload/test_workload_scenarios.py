"""Built-in scenarios carry the seed's numbers."""

from __future__ import annotations

import statistics
from collections import Counter

import pytest

from stepserve.workload import WorkloadError, get_workload, list_workloads


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


def test_night_report_is_the_seeds_64_way_job():
    w = get_workload("night-report")
    assert w.closed_loop_concurrency == 64 and w.num_requests == 6400
    assert w.shares["long"] == pytest.approx(10 / 64)
    # over several seeds (each seed alone varies by ~0.5 points)
    longs = total = 0
    for seed in range(5):
        specs = get_workload("night-report", seed=seed).generate()
        longs += sum(s.request_class == "long" for s in specs)
        total += len(specs)
    assert longs / total == pytest.approx(10 / 64, abs=0.005)
    outputs = [s.output_len for s in specs]
    assert set(outputs) == {20, 2000}
    assert percentile(outputs, 0.50) == 20 and percentile(outputs, 0.99) == 2000
    assert all(100 <= s.prompt_len <= 300 for s in specs)


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
    assert get_workload("mixed-pool", rate=3.0).arrival.rate_per_s == 3.0


def test_promo_spike_matches_the_seeds_traffic():
    w = get_workload("promo-spike", num_requests=20_000)
    assert w.arrival.rate_per_s * 60 == pytest.approx(980)
    specs = w.generate()
    outputs = [s.output_len for s in specs]
    assert statistics.mean(outputs) == pytest.approx(280, rel=0.05)
    over = [s for s in specs if s.output_len > 1200]
    assert len(over) / len(specs) == pytest.approx(0.06, abs=0.005)
    assert {s.request_class for s in over} == {"long"}  # `long` is exactly "over 1,200"
    assert all(s.prompt_len + s.max_tokens <= 4096 for s in specs)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(specs, specs[1:], strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(60 / 980, rel=0.03)


def test_promo_spike_closed_is_140_users_with_the_same_mix():
    closed = get_workload("promo-spike-closed", num_requests=500)
    assert closed.closed_loop_concurrency == 140
    assert closed.classes == get_workload("promo-spike").classes


def test_quickstart_fits_a_4k_model():
    specs = get_workload("quickstart").generate()
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
