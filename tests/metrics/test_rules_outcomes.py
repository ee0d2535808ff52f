"""The doctor on how requests ended and on the two latency rows it had no rule for:
rejections by reason (naming the setting that refused them), queue timeouts, a TPOT tail
with a normal mean (causes from the run's own figures), and high throughput with a poor
experience (goodput under the SLO). Rejections and timeouts come from real simulated
runs: prompts longer than max_model_len, a burst over a queue cap, a burst that outwaits
max_queue_time_s."""

from __future__ import annotations

import pytest

from stepserve.config.settings import EngineConfig
from stepserve.metrics.rules import (
    diagnose,
    rejections,
    throughput_over_experience,
    timeouts,
    tpot_tail,
)
from stepserve.metrics.run_summary import RunSummary
from stepserve.sim.cost import ConstantCost
from stepserve.sim.run import RunResult, simulate_run
from stepserve.workload.spec import RequestSpec

STEP = ConstantCost(0.01)


def _run(config: EngineConfig, specs: list[RequestSpec]) -> RunResult:
    run, _sim = simulate_run("run", config, specs, STEP, 2048, None)
    return run


def _found(run: RunResult, rule: str):
    found = {f.rule: f for f in diagnose(run.summary, run.rule_settings())}
    return found.get(rule)


def test_prompts_over_max_model_len_are_named_with_the_setting():
    # 31 of 100 prompts (with their max_tokens) over the default max_model_len of 4096
    specs = [RequestSpec(i, i * 0.05, 4090 if i % 100 < 31 else 200, 16, 16)
             for i in range(100)]
    run = _run(EngineConfig(), specs)
    assert run.summary.rejected_by_reason == {"too_long": 31}
    f = _found(run, "rejections")
    assert f is not None and f.severity == "critical"
    assert "31.0% of 100 requests were rejected" in f.evidence
    assert "prompt + max_tokens longer than max_model_len (4096) (31)" in f.evidence
    assert "raise max_model_len from 4096" in f.action and "own pool" in f.action


def test_a_burst_over_the_queue_cap_names_max_waiting_and_replicas():
    config = EngineConfig().replace(max_num_seqs=4, max_waiting=6)
    specs = [RequestSpec(i, 0.0, 32, 64, 64) for i in range(70)]
    run = _run(config, specs)
    by_reason = run.summary.rejected_by_reason
    assert set(by_reason) == {"queue_full"} and by_reason["queue_full"] >= 10
    f = _found(run, "rejections")
    assert f is not None and f.severity == "critical"
    assert "by the queue cap max_waiting = 6" in f.evidence
    assert "add replicas" in f.action and "raise max_waiting from 6" in f.action


def test_a_few_rejections_warn_and_none_is_silent():
    base = dict(requests_total=1000, requests_rejected=30, rejected_by_reason={"queue_full": 30})
    f = rejections(RunSummary.of(**base))
    assert f is not None and f.severity == "warning" and "3.0%" in f.evidence
    assert rejections(RunSummary.of(**{**base, "requests_rejected": 5,
                                       "rejected_by_reason": {"queue_full": 5}})) is None
    # an engine that counts rejections without their reason
    f = rejections(RunSummary.of(requests_total=100, requests_rejected=20))
    assert f is not None and "'unknown'" in f.evidence


def test_an_http_bench_reads_429s_as_the_queue_cap():
    s = RunSummary.of(requests_total=200, requests_failed=30, errors={"http_429": 30},
                      error_examples={"http_429": "the server is overloaded"})
    f = rejections(s)
    assert f is not None and f.severity == "critical" and "max_waiting" in f.evidence
    too_long = RunSummary.of(requests_total=200, errors={"http_400": 4}, error_examples={
        "http_400": "This model's maximum context length is 4096 tokens"})
    assert "max_model_len" in rejections(too_long).evidence


def test_queue_timeouts_name_max_queue_time_s():
    # four slots, 0.64 s a request: of 40 sent at once most wait past 1 s
    config = EngineConfig().replace(max_num_seqs=4, max_queue_time_s=1.0)
    specs = [RequestSpec(i, 0.0, 32, 64, 64) for i in range(40)]
    run = _run(config, specs)
    s = run.summary
    assert s.requests_timed_out / s.requests_total >= 0.05
    f = _found(run, "timeouts")
    assert f is not None
    assert f.severity == ("critical" if s.requests_timed_out / s.requests_total >= 0.1
                          else "warning")
    assert f"({int(s.requests_timed_out)}) timed out waiting to run, past " \
        "queue.max_queue_time_s = 1 s" in f.evidence
    assert "add replicas" in f.action and "raise max_queue_time_s from 1 s" in f.action
    assert timeouts(RunSummary.of(requests_total=1000, requests_timed_out=5)) is None


TPOT_TAIL = dict(tpot_p50_s=0.02, tpot_p99_s=0.12, tpot_mean_s=0.024, step_p50_s=0.02,
                 step_p99_s=0.03, preemptions=0, kv_usage_max=0.6, max_num_seqs=128)


@pytest.mark.parametrize(("changes", "cause"), [
    ({"preemptions": 14}, "14 preemptions"),
    ({"kv_usage_max": 0.98}, "KV usage peaked at 98.0%"),
    ({"step_p99_s": 0.2}, "step time swings: P99 0.2 s vs P50 0.02 s (10.0x"),
    ({}, "none of preemption, step-time swings or KV pressure shows"),
])
def test_a_tpot_tail_with_a_normal_mean_names_the_causes_this_run_shows(changes, cause):
    f = tpot_tail(RunSummary.of(**{**TPOT_TAIL, **changes}))
    assert f is not None and f.rule == "tpot_tail"
    assert "TPOT P99/P50 = 6.0 (P99 0.12 s, P50 0.02 s, mean 0.024 s)" in f.evidence
    assert cause in f.evidence
    assert "split online and offline" in f.action
    if "preemptions" in changes or "kv_usage_max" in changes:
        assert "lower concurrency (max_num_seqs from 128)" in f.action


def test_no_tpot_tail_when_the_pace_is_even_or_every_stream_is_slow():
    assert tpot_tail(RunSummary.of(**{**TPOT_TAIL, "tpot_p99_s": 0.09})) is None  # 4.5x
    # the mean far over the median: the typical stream is slow too (queueing, saturation)
    assert tpot_tail(RunSummary.of(**{**TPOT_TAIL, "tpot_mean_s": 0.05})) is None


def test_goodput_under_the_slo_says_limit_the_batch():
    s = RunSummary.of(throughput_requests_per_s=10.0, goodput_requests_per_s=4.0,
                      goodput_slo="ttft<=500ms", slot_utilization=0.97, running_max=256,
                      waiting_p50=0, max_num_seqs=256, max_num_batched_tokens=16384)
    f = throughput_over_experience(s)
    assert f is not None and f.severity == "critical"
    assert "goodput 4 req/s is 40.0% of the 10 req/s completed" in f.evidence
    assert "60.0% of completed requests missed the SLO (ttft<=500ms)" in f.evidence
    assert "lower max_num_seqs (now 256) and max_num_batched_tokens (now 16384)" in f.action
    assert "--slo" in f.action and "add replicas" not in f.action
    met = RunSummary.of(throughput_requests_per_s=10.0, goodput_requests_per_s=9.5)
    assert throughput_over_experience(met) is None
    # requests that waited for a slot missed the SLO in the queue: replicas first
    f = throughput_over_experience(RunSummary.of(**{**s.to_json(), "queue_time_p99_s": 3.0,
                                                    "ttft_p99_s": 3.2}))
    assert f.action.startswith("requests queued (queue time P99 3 s of a TTFT P99 of 3.2 s): "
                               "the SLO is missed waiting for a slot, so add replicas first")
    assert "then limit the batch" in f.action
    # a batch that never filled its slots: the step budget is the batch to limit
    f = throughput_over_experience(RunSummary.of(**{**s.to_json(), "running_max": 40}))
    assert "the step budget: lower max_num_batched_tokens (now 16384) (running never " \
        "filled max_num_seqs 256" in f.action
    assert "--vary max_num_batched_tokens=..." in f.action


def test_without_an_slo_a_busy_batch_with_a_far_ttft_tail_fires():
    s = RunSummary.of(ttft_p99_s=8.0, mean_step_s=0.04, slot_utilization=0.99,
                      waiting_p50=0, running_max=512, max_num_seqs=512)
    f = throughput_over_experience(s)
    assert f is not None and "TTFT P99 8 s is 200 mean steps" in f.evidence
    assert "--goodput" in f.action
    # a queue explains a long TTFT (the queue rules' case), as does an idle batch
    assert throughput_over_experience(RunSummary.of(**{**s.to_json(), "waiting_p50": 20})) \
        is None
    assert throughput_over_experience(RunSummary.of(**{**s.to_json(),
                                                       "slot_utilization": 0.5})) is None
    # a batch well below its slot cap is not too large: the tail is the prompts' own
    assert throughput_over_experience(RunSummary.of(**{**s.to_json(), "running_max": 46})) \
        is None
