"""Each of the incidents' rules fires on a summary crafted to trigger it, and stays silent on
healthy one."""

import dataclasses
from dataclasses import replace

import pytest

from stepserve.metrics import rules
from stepserve.metrics.rules import RULES, Finding, RuleSettings, diagnose, unevaluable
from stepserve.metrics.run_summary import RunSummary

HEALTHY = {
    "requests_total": 200, "requests_finished": 200, "requests_rejected": 0,
    "requests_timed_out": 0, "requests_aborted": 0, "output_tokens": 56000,
    "ttft_p50_s": 0.2, "ttft_p99_s": 0.6, "tpot_p50_s": 0.021, "tpot_p99_s": 0.03,
    "e2e_p50_s": 4.0, "e2e_p99_s": 9.0, "p99_p50_e2e_ratio": 2.25, "p99_p50_ttft_ratio": 3.0,
    "p99_p50_tpot_ratio": 1.4, "preemptions": 0, "preempted_requests": 0,
    "preemptions_on_long_share": None, "swapped_blocks": 0, "recomputed_tokens": 0,
    "long_request_threshold": 1200, "replicas": 1, "steps": 5000, "mean_step_s": 0.02,
    "decode_step_p50_s": 0.02, "step_p50_s": 0.02, "step_p99_s": 0.05, "step_max_s": 0.08,
    "itl_p99_s": 0.03, "slot_utilization": 0.85, "active_ratio_p50": 0.9,
    "active_ratio_mean": 0.85, "prefill_step_share": 0.05, "zero_decode_step_share": 0.0,
    "prefill_token_share": 0.3, "waiting_max": 3, "waiting_p50": 0,
    "waiting_nonzero_share": 0.1, "waiting_growth": 0.01, "waiting_trend_rise": 0.5,
    "waiting_monotonic_rise_s": 0.5, "waiting_monotonic_rise": 2, "running_max": 30,
    "running_mean": 20, "in_engine_max": 33, "kv_usage_max": 0.7, "kv_usage_mean": 0.5,
    "prefix_cache_hit_rate": 0.0, "prefix_repeated_share": 0.0,
}


def crafted(**changes) -> RunSummary:
    return RunSummary.from_json({**HEALTHY, **changes})


def with_config(summary: RunSummary, config: dict) -> RuleSettings:
    """The settings a run's config gives the rules (the summary's own first)."""
    return RuleSettings.of(summary, config)


TRIGGERS = [
    ("low_active_ratio", "warning", {"active_ratio_p50": 0.156}),
    ("low_slot_utilization", "warning", {"slot_utilization": 0.1647}),
    ("chunk_cap_eats_budget", "critical", {"prefill_step_share": 0.9}),
    ("chunk_cap_eats_budget", "critical", {"zero_decode_step_share": 0.2}),
    ("capacity", "critical", {"p99_p50_e2e_ratio": 12.0, "preemptions": 5}),
    ("capacity", "critical", {"p99_p50_ttft_ratio": 11.0, "preemptions": 1}),
    ("preemption_nonzero", "warning", {"preemptions": 11, "preempted_requests": 4,
                                       "recomputed_tokens": 900,
                                       "preemptions_on_long_share": 0.78}),
    ("queue_growing", "warning", {"waiting_growth": 0.16, "waiting_monotonic_rise": 38,
                                  "waiting_monotonic_rise_s": 240.0, "waiting_max": 38}),
    ("queue_growing", "warning", {"waiting_growth": 0.5, "waiting_trend_rise": 12.0,
                                  "waiting_max": 14}),
    ("running_below_offered", "warning", {"waiting_nonzero_share": 0.9, "waiting_p50": 12,
                                          "waiting_max": 38, "running_max": 128,
                                          "in_engine_max": 140, "max_num_seqs": 128}),
    ("tail_ttft_from_prefill", "warning", {"p99_p50_ttft_ratio": 6.3, "ttft_p99_s": 6.9,
                                           "ttft_p50_s": 1.1, "prefill_token_share": 0.9}),
    ("prefill_stalls_decode", "warning", {"step_p99_s": 2.5, "prefill_token_share": 0.67}),
    # a client's view only: token gaps, and prompt / output token counts
    ("prefill_stalls_decode", "warning", {"step_p99_s": None, "decode_step_p50_s": None,
                                          "prefill_token_share": None, "itl_p99_s": 0.9,
                                          "prompt_tokens": 12800, "output_tokens": 6400}),
]


@pytest.mark.parametrize("rule_id, severity, changes", TRIGGERS)
def test_rule_fires_on_a_crafted_summary(rule_id, severity, changes):
    rule = getattr(rules, rule_id)
    found = rule(crafted(**changes))
    assert found is not None and found.rule == rule_id and found.severity == severity
    assert any(ch.isdigit() for ch in found.evidence)  # the evidence carries the numbers
    assert found.action
    assert rule_id in [f.rule for f in diagnose(crafted(**changes))]


def test_every_rule_is_silent_on_a_healthy_summary():
    for rule in RULES:
        assert rule(crafted()) is None, rule.name
    assert diagnose(crafted()) == []


def test_rules_stay_silent_without_their_inputs():
    assert diagnose(RunSummary()) == []
    assert diagnose(RunSummary.from_json({key: None for key in HEALTHY})) == []


@pytest.mark.parametrize("rule_id, changes", [
    ("low_active_ratio", {"active_ratio_p50": 0.30}),
    ("low_slot_utilization", {"slot_utilization": 0.50}),
    ("chunk_cap_eats_budget", {"prefill_step_share": 0.70, "zero_decode_step_share": 0.10}),
    ("capacity", {"p99_p50_e2e_ratio": 10.0, "preemptions": 3}),
    ("capacity", {"p99_p50_e2e_ratio": 50.0, "preemptions": 0}),  # a tail, no preemption
    ("queue_growing", {"waiting_growth": -0.5, "waiting_max": 80,
                       "waiting_monotonic_rise": 40}),
    ("queue_growing", {"waiting_growth": 0.1, "waiting_monotonic_rise": 3,
                       "waiting_trend_rise": 4.0}),
    ("tail_ttft_from_prefill", {"p99_p50_ttft_ratio": 8.0, "tpot_p50_s": 0.2,
                                "prefill_token_share": 0.9}),  # decode slow too
    ("tail_ttft_from_prefill", {"p99_p50_ttft_ratio": 8.0, "ttft_p99_s": 8.0,
                                "ttft_p50_s": 1.0, "prefill_token_share": 0.3}),  # queueing
    ("running_below_offered", {"waiting_nonzero_share": 0.5, "waiting_p50": 2}),
    ("prefill_stalls_decode", {"step_p99_s": 0.1}),  # 5x a decode step: not over
    ("prefill_stalls_decode", {"step_p99_s": 3.0, "prefill_token_share": 0.19}),
    # a static batch fed by 64 clients: never more than 64 in the engine, idle slots queue
    ("running_below_offered", {"waiting_nonzero_share": 0.98, "waiting_p50": 54,
                               "running_max": 64, "in_engine_max": 64, "max_num_seqs": 64}),
    # a burst: 61 arrive at once (one step), the fitted line barely climbs
    ("queue_growing", {"waiting_growth": 1e-4, "waiting_trend_rise": 0.8,
                       "waiting_monotonic_rise": 61, "waiting_monotonic_rise_s": 0.025,
                       "mean_step_s": 0.025, "waiting_max": 61, "running_max": 64}),
])
def test_thresholds_are_strict_and_need_all_their_conditions(rule_id, changes):
    assert getattr(rules, rule_id)(crafted(**changes)) is None
    assert rule_id not in [f.rule for f in diagnose(crafted(**changes))]


def test_the_seeds_numbers_in_the_evidence_and_action():
    f = rules.low_slot_utilization(crafted(slot_utilization=21080 / 128000))
    assert "16.5%" in f.evidence and "6.1x" in f.evidence
    assert "continuous batching" in f.action and "stepserve plan speedup" in f.action
    assert "10-20x" in f.action
    f = rules.preemption_nonzero(crafted(preemptions=11, preempted_requests=4,
                                          recomputed_tokens=900, swapped_blocks=0,
                                          preemptions_on_long_share=0.78))
    assert "11 preemptions on 4 requests" in f.evidence and "900 tokens recomputed" in \
        f.evidence and "78.0%" in f.evidence and "1200" in f.evidence
    f = rules.capacity(crafted(p99_p50_e2e_ratio=12.0, preemptions=5))
    assert "add replicas first" in f.action and "stepserve plan capacity" in f.action
    assert "max_waiting" in f.action
    f = rules.queue_growing(crafted(waiting_growth=0.16, waiting_monotonic_rise=38,
                                     waiting_monotonic_rise_s=240.0, waiting_max=38))
    assert "+38 in 240 s" in f.evidence and "max_queue_time_s" in f.action


def test_config_names_the_chunk_cap_and_the_settings():
    nested = {"scheduler": {"max_num_batched_tokens": 32768, "long_prefill_token_threshold": 0,
                            "budget_order": "prefill_first", "max_num_seqs": 128}}
    chunk = crafted(zero_decode_step_share=0.9)
    f = rules.chunk_cap_eats_budget(chunk, with_config(chunk, nested))
    assert "long_prefill_token_threshold = 0" in f.action
    assert "32768 of max_num_batched_tokens = 32768" in f.action
    assert "e.g. 8192 of 32768" in f.action and "decode_first (now prefill_first)" in f.action
    assert "max_num_partial_prefills 1" in f.action
    plain = rules.chunk_cap_eats_budget(crafted(zero_decode_step_share=0.9))
    assert "e.g. 2048 of 8192" in plain.action
    tail = crafted(p99_p50_e2e_ratio=12.0, preemptions=5)
    f = rules.capacity(tail, with_config(tail, nested))
    assert "max_num_seqs (now 128)" in f.action
    low = crafted(slot_utilization=0.3)
    flat = rules.low_slot_utilization(low, with_config(low, {"batching": "continuous"}))
    assert "already continuous" in flat.action


def test_running_below_offered_uses_max_num_seqs_when_known():
    queued = crafted(waiting_nonzero_share=0.9, waiting_p50=12, waiting_max=38,
                     running_max=128, in_engine_max=166, replicas=None)  # replicas: config
    assert rules.running_below_offered(queued) is not None  # from the waiting queue alone
    for config, fires in (({"max_num_seqs": 128}, True), ({"max_num_seqs": 256}, False),
                          ({"max_num_seqs": 64, "replicas": 3}, False)):
        found = rules.running_below_offered(queued, with_config(queued, config))
        assert (found is not None) == fires, config
    two = crafted(waiting_nonzero_share=0.9, waiting_p50=12, running_max=80, in_engine_max=92,
                  replicas=2)
    f = rules.running_below_offered(two, with_config(two, {"scheduler": {"max_num_seqs": 40}}))
    assert f is not None and "max_num_seqs 40 x 2 replica(s)" in f.evidence


def test_the_three_incidents_in_summary_form():
    static = crafted(slot_utilization=0.1647, active_ratio_p50=0.156,
                     p99_p50_e2e_ratio=100.0)
    assert {f.rule for f in diagnose(static, with_config(static, {"batching": "static"}))} == \
        {"low_slot_utilization", "low_active_ratio"}
    chunk = crafted(prefill_step_share=1.0, zero_decode_step_share=0.9)
    assert [f.rule for f in diagnose(chunk)] == ["chunk_cap_eats_budget"]
    promo = crafted(p99_p50_ttft_ratio=9.4 / 0.9, p99_p50_e2e_ratio=47 / 4.0, preemptions=44,
                    preempted_requests=30, preemptions_on_long_share=0.78,
                    waiting_growth=0.16, waiting_monotonic_rise=38,
                    waiting_monotonic_rise_s=240.0, waiting_max=38, waiting_p50=20,
                    waiting_nonzero_share=0.8, running_max=128, in_engine_max=140)
    found = diagnose(promo, with_config(promo, {"max_num_seqs": 128}))
    assert found[0].rule == "capacity" and found[0].severity == "critical"
    assert {"capacity", "preemption_nonzero", "queue_growing", "running_below_offered"} <= \
        {f.rule for f in found}


def test_findings_are_frozen_checked_and_serialisable():
    f = Finding("capacity", "critical", "P99/P50 12", "add replicas")
    assert f.to_json() == {"rule": "capacity", "severity": "critical",
                           "evidence": "P99/P50 12", "action": "add replicas"}
    assert f.on_run("A").to_json() == {"run": "A", **f.to_json()}
    assert Finding.from_json(f.on_run("A").to_json()) == f.on_run("A")
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.rule = "x"
    with pytest.raises(ValueError, match="severity"):
        Finding("capacity", "urgent", "", "")


def test_diagnose_lists_critical_first():
    s = crafted(active_ratio_p50=0.1, prefill_step_share=0.95)
    assert [f.severity for f in diagnose(s)] == ["critical", "warning"]


def test_running_below_offered_blames_kv_when_slots_were_free():
    queued = crafted(waiting_nonzero_share=0.9, waiting_p50=12, running_max=200,
                     in_engine_max=280, max_num_seqs=128, replicas=2)
    assert rules.running_below_offered(queued) is None  # budget-bound: neither ran out
    f = rules.running_below_offered(replace(queued, preemptions=40))
    assert f is not None and "KV blocks were the limit (40 preemptions" in f.evidence
    assert rules.running_below_offered(replace(queued, kv_usage_max=0.99)) is not None


def test_tail_ttft_is_left_to_the_queue_rule_when_requests_waited_for_slots():
    tail = crafted(p99_p50_ttft_ratio=6.0, ttft_p99_s=6.0, ttft_p50_s=1.0,
                   prefill_token_share=0.9)
    assert rules.tail_ttft_from_prefill(tail) is not None
    queued = replace(tail, waiting_nonzero_share=0.9, waiting_p50=60, running_max=120,
                     in_engine_max=192, max_num_seqs=40, replicas=3)
    assert rules.tail_ttft_from_prefill(queued) is None
    assert "running_below_offered" in [f.rule for f in diagnose(queued)]


def test_low_active_ratio_falls_back_on_slot_utilization_and_says_so():
    # a live window has no per-step ratios: its only active ratio is slot-weighted,
    # i.e. slot utilisation (and a per-step mean without its median is that same number)
    live = replace(crafted(slot_utilization=0.2, active_ratio_mean=0.2), active_ratio_p50=None)
    f = rules.low_active_ratio(live)
    assert f is not None and "slot utilisation" in f.evidence and "median" not in f.evidence
    assert "20.0%" in f.evidence
    # slot utilisation decides there, not a bare mean
    assert rules.low_active_ratio(replace(crafted(slot_utilization=0.9, active_ratio_mean=0.1),
                                          active_ratio_p50=None)) is None
    # strict, as the median
    assert rules.low_active_ratio(RunSummary(slot_utilization=0.3)) is None
    # a bare mean, with nothing else, is still read and named as a mean
    f = rules.low_active_ratio(RunSummary(active_ratio_mean=0.2))
    assert f is not None and "mean over steps" in f.evidence
    # with a median it is the median that decides, the mean only shown
    f = rules.low_active_ratio(crafted(active_ratio_p50=0.1, active_ratio_mean=0.5))
    assert "median" in f.evidence and "(mean over steps 50.0%)" in f.evidence
    assert rules.low_active_ratio(crafted(active_ratio_p50=0.5, active_ratio_mean=0.1)) is None


def test_unevaluable_names_the_missing_inputs():
    assert unevaluable(crafted(max_num_seqs=64)) == {}
    # without an SLO, whether the batch was too large needs its slot cap: from the
    # summary, or from the run's config where the summary has none (a live vLLM window)
    assert unevaluable(crafted()) == {
        "throughput_over_experience": ["goodput_requests_per_s or max_num_seqs"]}
    assert unevaluable(crafted(), with_config(crafted(), {"max_num_seqs": 64})) == {}
    missing = unevaluable(RunSummary(preemptions=0, waiting_growth=0.0))
    assert "queue_growing" not in missing and "preemption_nonzero" not in missing
    assert missing["capacity"] == ["p99_p50_e2e_ratio or p99_p50_ttft_ratio"]
    assert missing["low_active_ratio"] == [
        "active_ratio_p50 or slot_utilization or active_ratio_mean"]
