"""The three incidents on the simulator with the real scheduler: what each run shows
beyond the incident's figures (test_incident_figures.py pins those)."""

import pytest

from stepserve.sim.run import run_scenario
from stepserve.sim.scenarios import get_scenario
from stepserve.workload.overrides import WorkloadOverrides


def by_name(result):
    return {r.name: r for r in result.runs}


def rules(result, run):
    return {f.rule for f in result.findings if f.run == run}


@pytest.fixture(scope="module")
def night():
    return run_scenario(get_scenario("night-report"), WorkloadOverrides(num_requests=1280))


def test_night_report_static_batches_idle_exactly_the_incidents_slots(night):
    runs = by_name(night)
    static, dynamic = runs["static"].summary, runs["dynamic"].summary
    # every round is 54 x 20 + 10 x 2,000: 21,080 useful of 64 x 2,000 slot-steps
    assert static.slot_utilization == pytest.approx(21_080 / 128_000, abs=1e-3)
    assert night.comparison.static_slot_utilization_computed == pytest.approx(0.1647, abs=1e-4)
    # closed loop: a 64 / 50 ms window closes on 64 waiting at once, as static batching
    assert dynamic.throughput_tokens_per_s == pytest.approx(static.throughput_tokens_per_s,
                                                            rel=1e-3)
    assert runs["continuous"].summary.slot_utilization > 0.95


def test_night_report_doctor_flags_static_slots_not_continuous(night):
    assert {"low_slot_utilization", "low_active_ratio"} <= rules(night, "static")
    assert {"low_slot_utilization", "low_active_ratio"} <= rules(night, "dynamic")
    assert not {"low_slot_utilization", "low_active_ratio"} & rules(night, "continuous")


def test_promo_spike_queues_behind_the_pools_128_running(promo_spike):
    runs = by_name(promo_spike)
    before, after = runs["before"].summary, runs["after"].summary
    assert before.running_max == 128  # 2 replicas x 64: the pool's max_num_seqs
    assert before.waiting_max > 24 and before.in_engine_max > 140
    # the long answers are the low priority: they wait, and make the TTFT tail
    long_before = runs["before"].by_class["long"]
    assert long_before.ttft_p99_s > 3 * runs["before"].by_class["short"].ttft_p99_s
    assert before.preemptions == 0  # KV never runs out at these sizes (docs/guide.md)
    assert after.requests_rejected == 0 and after.running_max <= 120
    assert after.waiting_max < 24
