"""The seed's three incidents, reproduced on the simulator with the real scheduler
(issue 2, "What must be shown" 2-4)."""

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


@pytest.fixture(scope="module")
def mixed():
    return run_scenario(get_scenario("mixed-pool"))


@pytest.fixture(scope="module")
def promo():
    return run_scenario(get_scenario("promo-spike"))


def test_night_report_continuous_reaches_90_percent_of_the_speedup_cap(night):
    comp = night.comparison
    assert comp.speedup >= 0.9 * comp.speedup_cap
    runs = by_name(night)
    static = runs["static"].summary
    # the seed's 16.5% for 10 long of 64; this stream's draw has slightly fewer long ones
    assert 0.12 < static.slot_utilization < 0.2
    assert abs(static.slot_utilization - comp.static_slot_utilization_computed) < 0.01
    assert runs["continuous"].summary.slot_utilization > 0.95


def test_night_report_doctor_flags_static_slots_not_continuous(night):
    assert {"low_slot_utilization", "low_active_ratio"} <= rules(night, "static")
    assert {"low_slot_utilization", "low_active_ratio"} <= rules(night, "dynamic")
    assert not {"low_slot_utilization", "low_active_ratio"} & rules(night, "continuous")


def test_mixed_pool_bad_chunk_cap_starves_decode_and_the_fix_removes_it(mixed):
    runs = by_name(mixed)
    before, after = runs["before"], runs["after"]
    chat_before = before.by_class["chat"].ttft_p99_s
    chat_after = after.by_class["chat"].ttft_p99_s
    assert chat_before >= 4 * chat_after
    assert before.summary.zero_decode_step_share > 0.10
    assert after.summary.zero_decode_step_share < 0.01
    # TPOT spikes: a token waits a whole 32K prefill step (about a second) in the bad config
    assert before.summary.itl_p99_s > 3 * after.summary.itl_p99_s
    assert before.summary.tpot_p99_s > after.summary.tpot_p99_s
    assert "chunk_cap_eats_budget" in rules(mixed, "before")
    assert "chunk_cap_eats_budget" not in rules(mixed, "after")
    finding = next(f for f in mixed.findings if f.rule == "chunk_cap_eats_budget")
    assert "long_prefill_token_threshold" in finding.action


def test_promo_spike_is_a_capacity_problem_and_the_fix_cuts_p99_ttft(promo):
    runs = by_name(promo)
    before, after = runs["before"].summary, runs["after"].summary
    assert before.preemptions > 0
    assert before.preemptions_on_long_share > 0.5
    assert max(before.p99_p50_e2e_ratio, before.p99_p50_ttft_ratio) > 10
    assert "capacity" in rules(promo, "before")
    assert after.ttft_p99_s * 3 <= before.ttft_p99_s
    assert after.requests_rejected > 0  # the 429s max_waiting 24 turns away
    assert after.requests_rejected + after.requests_finished == after.requests_total


def test_quickstart_configs_trade_latency_for_throughput():
    runs = by_name(run_scenario(get_scenario("quickstart")))
    a, b, c = (runs[k].summary for k in "ABC")
    assert b.throughput_tokens_per_s > a.throughput_tokens_per_s  # B: throughput
    assert a.tpot_p99_s < b.tpot_p99_s  # A: fastest tokens once running
    assert c.tpot_p99_s < b.tpot_p99_s and c.e2e_p99_s < b.e2e_p99_s  # C: steady
