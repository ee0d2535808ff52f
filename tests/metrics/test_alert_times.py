"""The lead of an early signal over the late alert it precedes is measured on the run's
own series (when the waiting queue reached 10, when the rolling TTFT P99 passed 5 s, ...)
and printed as measured; an incident's figure is only quoted as what it reported."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stepserve.config.settings import EngineConfig
from stepserve.core.output import StepRecord
from stepserve.core.request import FinishReason
from stepserve.metrics.request_metrics import RequestLatencies
from stepserve.metrics.rules import (
    alert_times,
    chunk_cap_eats_budget,
    low_active_ratio,
    queue_growing,
)
from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.step_metrics import per_replica
from stepserve.sim.cost import ConstantCost
from stepserve.sim.run import simulate_run
from stepserve.workload.spec import RequestSpec

DUR = 0.5  # seconds a hand-built step takes


def step(i: int, *, waiting: int = 0, prefill_only: bool = False, held: int = 4,
         active: int = 4) -> StepRecord:
    return StepRecord(index=i, start_s=i * DUR, duration_s=DUR,
                      num_prefill_tokens=512 if prefill_only else 0,
                      num_decode_tokens=0 if prefill_only else held,
                      num_scheduled_seqs=held, num_decode_ready=0, num_running=held,
                      num_waiting=waiting, num_swapped=0, num_preempted=0, kv_usage=0.5,
                      slots_held=held, num_active=active)


def first_token(i: int, arrival: float, ttft: float) -> RequestLatencies:
    return RequestLatencies(
        request_id=str(i), request_class="default", arrival_time=arrival,
        finish_reason=FinishReason.STOP, reject_reason=None, num_prompt_tokens=16,
        num_output_tokens=8, scheduled=True, ttft_s=ttft, tpot_s=0.01, e2e_s=ttft + 0.07,
        queue_time_s=ttft, itl_s=(), num_preemptions=0, num_swapped_out_blocks=0,
        num_recomputed_tokens=0)


def queue_climbing_from(first: int, n: int = 400) -> list[StepRecord]:
    """The queue is empty until step `first`, then grows by one a step."""
    return [step(i, waiting=max(0, i - first)) for i in range(n)]


# one request a second from t=0; TTFT 0.2 s until t=150, then 8 s
REQUESTS = [first_token(i, float(i), 0.2 if i < 150 else 8.0) for i in range(200)]
GROWING = dict(waiting_growth=0.5, waiting_trend_rise=40.0, waiting_max=40, running_max=4)


def lead_text(steps: list[StepRecord]) -> str:
    s = RunSummary.of(**GROWING).updated(alert_times(REQUESTS, steps))
    f = queue_growing(s)
    assert f is not None
    return f.evidence


def test_the_lead_is_computed_from_the_series():
    # step i ends at (i + 1) x 0.5 s: the queue reaches 10 at step first + 10; the first
    # 8 s TTFT comes out at 158 s, over 1% of the last minute's first tokens
    assert "in this run the waiting queue reached 10 at t=60.5 s, 97.5 s before TTFT P99 " \
        "passed 5 s" in lead_text(queue_climbing_from(110))
    # the queue climbs later: the measured lead shrinks with it
    assert "in this run the waiting queue reached 10 at t=120 s, 38 s before TTFT P99 " \
        "passed 5 s" in lead_text(queue_climbing_from(229))
    # and it can come after the late alert: no lead in such a run
    assert "in this run TTFT P99 passed 5 s at t=158 s, before the waiting queue reached " \
        "10 (t=180 s): no lead" in lead_text(queue_climbing_from(349))


def test_the_incidents_figure_is_only_quoted_as_reported():
    text = lead_text(queue_climbing_from(110))
    assert "(the promo-spike incident reported its queue about 20 minutes ahead of its " \
        "P99 alert)" in text
    assert text.count("20 minutes") == 1
    # a summary without the series (a live window) has nothing to time
    live = queue_growing(RunSummary.of(**GROWING))
    assert "this summary has no time series to measure the lead (the promo-spike incident " \
        "reported" in live.evidence
    assert "in this run" not in live.evidence


def test_the_rolling_ttft_p99_counts_the_last_minute_only():
    steps = [step(i) for i in range(10)]
    fast = [first_token(i, i * 0.25, 0.2) for i in range(200)]
    # one 6 s first token at 46 s, among the 184 that came out before it: under 1%
    one_slow = fast + [first_token(999, 40.0, 6.0)]
    assert alert_times(one_slow, steps).alert_ttft_p99_at_s is None
    # a second one at 46.1 s: 2 of 186, over 1%
    two = one_slow + [first_token(998, 40.1, 6.0)]
    assert alert_times(two, steps).alert_ttft_p99_at_s == pytest.approx(46.1)
    # slow first tokens a minute apart never make 1% of a busy minute
    spread = [first_token(i, i * 0.25, 0.2) for i in range(1200)]
    spread += [first_token(990 + k, 100.0 + 60.0 * k, 6.0) for k in range(3)]
    assert alert_times(spread, steps).alert_ttft_p99_at_s is None


def test_the_prefill_share_and_active_ratio_leads():
    # prefill-only steps from step 150 on: 71 of the last 100 at step 220
    steps = [step(i, prefill_only=i >= 150) for i in range(300)]
    s = alert_times(REQUESTS, steps)
    assert s.alert_prefill_share_at_s == 110.5
    f = chunk_cap_eats_budget(RunSummary.of(prefill_step_share=0.9).updated(s))
    assert "in this run the last 100 steps passed 70% prefill-only or 10% zero-decode at " \
        "t=110 s, 47.5 s before TTFT P99 passed 5 s" in f.evidence
    # a static batch: 64 slots held, 10 active from step 20 (the night-report batch)
    batch = [step(i, held=64, active=64 if i < 20 else 10) for i in range(200)]
    s = alert_times([], batch)
    assert s.alert_low_active_at_s == 15.0  # under 30% from step 20, for 10 steps
    # cumulative (64 x 20 + 10 x k) / (64 x (20 + k)) < 0.5 from k = 30: step 49 on
    assert s.alert_low_slot_util_at_s == 29.5
    f = low_active_ratio(RunSummary.of(active_ratio_p50=0.16).updated(s))
    assert "in this run the active ratio stayed under 30% for 10 steps at t=15 s, 14.5 s " \
        "before slot utilisation since the start stayed under 50% for 10 steps" in f.evidence
    later = [replace(r, num_active=64) if r.index < 40 else r for r in batch]
    assert "at t=25 s, 29 s before" in low_active_ratio(
        RunSummary.of(active_ratio_p50=0.16).updated(alert_times([], later))).evidence


def test_a_simulated_queue_is_timed_from_its_own_step_records():
    # four slots serve about 4 requests a second; 8 arrive a second
    config = EngineConfig().replace(max_num_seqs=4)
    specs = [RequestSpec(i, i / 8, 32, 100, 100) for i in range(160)]
    run, sim = simulate_run("overloaded", config, specs, ConstantCost(0.01), 4096, None)
    s = run.summary
    reached = next(r.start_s + r.duration_s for r in per_replica(sim.steps)[0]
                   if r.num_waiting >= 10)
    assert s.alert_queue_at_s == reached  # the run starts with its first arrival at 0
    assert s.alert_ttft_p99_at_s is not None and s.alert_ttft_p99_at_s > reached
    f = queue_growing(s)
    assert f is not None
    assert f"in this run the waiting queue reached 10 at t={reached:.3g} s, " \
        f"{s.alert_ttft_p99_at_s - reached:.3g} s before TTFT P99 passed 5 s" in f.evidence
