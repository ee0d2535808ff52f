"""The live summary from canned /metrics texts of each server (stepserve, vLLM, SGLang,
TGI), the rules it feeds, and the rules it cannot."""

import pytest
from metrics.canned_texts import hist, rising_vllm_window, vllm_text, window

from stepserve.metrics.live_window import LIVE_KEYS, live_config, live_summary
from stepserve.metrics.rules import RULES, RuleSettings, diagnose, unevaluable

RULE_NAMES = {rule.name for rule in RULES}


def test_vllm_window_summary():
    s = live_summary(rising_vllm_window())
    assert list(s.to_json()) == list(LIVE_KEYS)
    assert s.metrics_source == "vllm" and s.scrape_samples == 11 and s.window_s == 10
    assert s.waiting_max == 20 and s.running_max == 8 and s.kv_usage_max == 0.97
    assert s.in_engine_max == 28
    assert s.waiting_growth == pytest.approx(2.0)
    assert s.waiting_trend_rise == pytest.approx(20.0)
    assert s.waiting_nonzero_share == pytest.approx(10 / 11)
    assert s.preemptions == 7 and s.requests_finished == 20  # aborts left out
    assert s.prompt_tokens == 2000 and s.generation_tokens == 6000
    assert s.prefill_token_share == pytest.approx(0.25)
    # TTFT: rank 10 of 20 in (0.05, 0.1] (18 there); rank 19.8 in (5, 10] (2 there)
    assert s.ttft_p50_s == pytest.approx(0.05 + 0.05 * 10 / 18)
    assert s.ttft_p99_s == pytest.approx(5 + 5 * 1.8 / 2)
    assert s.p99_p50_ttft_ratio == pytest.approx(s.ttft_p99_s / s.ttft_p50_s)
    assert s.tpot_p50_s == pytest.approx(0.01 + 0.04 * 10 / 20)
    # vLLM counts no step kinds, no slots and no step time
    for value in (s.prefill_step_share, s.active_ratio_mean, s.mean_step_s, s.slot_utilization):
        assert value is None


def test_vllm_rising_queue_and_preemptions_fire_the_rules():
    s = live_summary(rising_vllm_window())
    config = live_config(rising_vllm_window()[-1])
    rules = {f.rule for f in diagnose(s, RuleSettings.of(s, config))}
    assert {"queue_growing", "preemption_nonzero", "capacity", "running_below_offered"} <= rules
    assert set(unevaluable(s)) == {"chunk_cap_eats_budget", "tail_ttft_from_prefill",
                                   "low_slot_utilization", "low_active_ratio",
                                   "prefill_stalls_decode", "rejections", "timeouts",
                                   "throughput_over_experience", "prefix_cache_thrash"}
    assert unevaluable(s)["tail_ttft_from_prefill"] == ["mean_step_s"]
    # vLLM publishes no step time, and this window has no ITL histogram
    assert unevaluable(s)["prefill_stalls_decode"] == ["step_p99_s or itl_p99_s"]
    # nor admission_rejections: the requests that ended (stop 10 -> 30, abort 7 -> 7) are
    # counted, the refused not
    assert s.requests_total == 20 and unevaluable(s)["rejections"] == [
        "requests_rejected or rejected_by_reason or errors"]


def test_nothing_finished_in_the_window_leaves_latency_unknown():
    flat = vllm_text(waiting=0, preempted=0, fast=3, slow=0, stop=3)
    s = live_summary(window(flat, flat))
    assert s.requests_finished == 0 and s.preemptions == 0
    for value in (s.ttft_p50_s, s.ttft_p99_s, s.e2e_p99_s, s.tpot_p50_s, s.p99_p50_e2e_ratio):
        assert value is None
    assert diagnose(s) == []
    assert "capacity" in unevaluable(s)  # no tail ratio without a finished request


# ---- SGLang ----

def sglang_text(queue: int, retracted: int, done: int) -> str:
    return (f'sglang:num_queue_reqs{{model_name="m"}} {queue}\n'
            'sglang:num_running_reqs{model_name="m"} 4\n'
            'sglang:token_usage{model_name="m"} 0.4\n'
            f'sglang:num_retracted_requests_total{{model_name="m"}} {retracted}\n'
            f'sglang:prompt_tokens_total{{model_name="m"}} {done * 50}\n'
            f'sglang:generation_tokens_total{{model_name="m"}} {done * 150}\n'
            f'sglang:num_requests_total{{model_name="m"}} {done}\n'
            + hist("sglang:time_to_first_token_seconds", (0.1, 0.2), [done, 0, 0], 1)
            + hist("sglang:e2e_request_latency_seconds", (1.0, 2.0), [0, done, 0], 1)
            + hist("sglang:inter_token_latency_seconds", (0.01, 0.02), [0, done, 0], 1))


def test_sglang_window_summary():
    s = live_summary(window(sglang_text(1, 0, 10), sglang_text(3, 2, 30)))
    assert s.metrics_source == "sglang"
    assert s.waiting_max == 3 and s.running_max == 4 and s.kv_usage_max == 0.4
    assert s.preemptions == 2 and s.requests_finished == 20
    assert s.prefill_token_share == pytest.approx(0.25)
    assert s.ttft_p50_s == pytest.approx(0.05) and s.e2e_p50_s == pytest.approx(1.5)
    assert s.tpot_p50_s == pytest.approx(0.015)
    assert s.mean_step_s is None and s.steps is None
    assert "preemption_nonzero" in {f.rule for f in diagnose(s)}


# ---- TGI ----

def tgi_text(queue: int, done: int, steps: int) -> str:
    methods = "".join(hist("tgi_batch_inference_duration", (0.01, 0.1), [0, n, 0],
                           n * 0.05, labels=f'method="{m}"')
                      + f'tgi_batch_inference_success{{method="{m}"}} {n}\n'
                      for m, n in (("prefill", steps // 4), ("decode", steps - steps // 4)))
    return (f"tgi_queue_size {queue}\ntgi_batch_current_size 6\n"
            f"tgi_request_success {done}\n"
            + hist("tgi_request_input_length", (100, 1000), [0, done, 0], done * 300,
                   labels='x="1"')
            + hist("tgi_request_generated_tokens", (100, 1000), [done, 0, 0], done * 100,
                   labels='x="1"')
            + hist("tgi_request_duration", (1.0, 5.0), [0, done, 0], done * 2.0, labels='x="1"')
            + hist("tgi_request_mean_time_per_token_duration", (0.01, 0.05), [0, done, 0],
                   done * 0.02, labels='x="1"')
            + methods)


def test_tgi_window_summary():
    s = live_summary(window(tgi_text(0, 4, 40), tgi_text(5, 12, 120)))
    assert s.metrics_source == "tgi"
    assert s.waiting_max == 5 and s.running_max == 6 and s.kv_usage_max is None
    assert s.requests_finished == 8 and s.steps == 80
    assert s.prefill_token_share == pytest.approx(0.75)  # 300 in, 100 out per request
    assert s.e2e_p50_s == pytest.approx(3.0) and s.tpot_p50_s == pytest.approx(0.03)
    assert s.mean_step_s == pytest.approx(0.05)
    assert s.ttft_p50_s is None and s.preemptions is None  # TGI has neither
    missing = unevaluable(s)
    assert missing["preemption_nonzero"] == ["preemptions"]
    assert "p99_p50_ttft_ratio" in missing["tail_ttft_from_prefill"]


# ---- stepserve: the texts our own ServerMetrics renders ----

def test_stepserve_window_summary_and_config():
    pytest.importorskip("prometheus_client")
    from stepserve.config.settings import SchedulerConfig
    from stepserve.core.output import StepRecord
    from stepserve.server.metrics import ServerMetrics

    def step(i, prefill, decode, ready, held, active):
        return StepRecord(i, 0.0, 0.01, prefill, decode, 1, ready, held, 0, 0, 0, 0.5, held,
                          active)

    m = ServerMetrics("m", SchedulerConfig(max_num_seqs=2, budget_order="prefill_first"))
    m.on_steps([step(0, 64, 0, 0, 2, 1)], 0.03)  # before the window
    before = m.render().decode()
    m.on_steps([step(1, 64, 0, 0, 2, 0)], 0.02)  # prefill only
    m.on_steps([step(2, 64, 0, 2, 2, 0)], 0.04)  # prefill only, decode starved
    m.on_steps([step(3, 0, 4, 4, 4, 4)], 0.03)
    s = live_summary(window(before, m.render().decode()))
    assert s.metrics_source == "stepserve" and s.steps == 3
    assert s.prefill_step_share == pytest.approx(2 / 3)
    assert s.zero_decode_step_share == pytest.approx(1 / 3)
    assert s.mean_step_s == pytest.approx(0.03)
    # a ratio of sums: slot utilisation, not a mean of per-step ratios (not published)
    assert s.slot_utilization == pytest.approx(4 / 8) and s.active_ratio_mean is None
    config = live_config(window(before)[0])
    assert config["max_num_seqs"] == 2 and config["budget_order"] == "prefill_first"
    found = {f.rule: f for f in diagnose(s, RuleSettings.of(s, config))}
    assert "chunk_cap_eats_budget" in found
    assert "(now prefill_first)" in found["chunk_cap_eats_budget"].action


def test_our_rejections_feed_the_rejections_rule():
    from stepserve.server.metrics import ServerMetrics

    m = ServerMetrics("m")
    before = m.render().decode()
    m.success.labels("m", "0", "stop").inc(90)
    for _ in range(10):
        m.on_rejected("queue_full")
    s = live_summary(window(before, m.render().decode()))
    assert s.requests_total == 100 and s.requests_rejected == 10
    assert s.rejected_by_reason == {"queue_full": 10.0}
    f = next(f for f in diagnose(s, RuleSettings.of(s, {"max_waiting": 24}))
             if f.rule == "rejections")
    assert f.severity == "critical" and "by the queue cap max_waiting = 24 (10)" in f.evidence


def test_a_text_with_our_series_and_vllms_is_read_as_ours():
    # our server may export vLLM-named copies of its series beside its own: the doctor
    # reads ours (the first source in SOURCES), not a sum of both
    from pathlib import Path

    from stepserve.config.settings import SchedulerConfig
    from stepserve.server.metrics import ServerMetrics

    m = ServerMetrics("m", SchedulerConfig(max_num_seqs=2))
    m.waiting.set(3)
    vllm = (Path(__file__).parent.parent / "fixtures" / "vllm-0.32.0" /
            "metrics_load_3.txt").read_text()  # 28 waiting
    both = m.render().decode() + vllm
    (snap,) = window(both)
    assert snap.source().name == "stepserve" and snap.level("waiting") == 3
    s = live_summary(window(both, both))
    assert s.metrics_source == "stepserve" and s.waiting_max == 3
    assert s.waiting_by_reason_max is None  # vLLM's split queue is not ours
    assert live_config(snap)["max_num_seqs"] == 2


# ---- what the rules need ----

def test_every_rule_says_what_it_reads():
    assert all(rule.needs for rule in RULES) and len(RULE_NAMES) == len(RULES)


def test_an_empty_summary_evaluates_nothing_and_fires_nothing():
    s = live_summary([])
    assert s.scrape_samples == 0 and s.metrics_source is None
    assert diagnose(s) == [] and set(unevaluable(s)) == RULE_NAMES
