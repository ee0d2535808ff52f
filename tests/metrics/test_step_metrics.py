"""Step-level metrics on hand-built StepRecords: slot utilisation, step shares, queues."""

import pytest

from stepserve.core.output import StepRecord
from stepserve.metrics.step_metrics import (
    TimeSeries,
    longest_monotonic_rise,
    step_summary,
    timeseries,
)
from stepserve.metrics.summary import summarize
from stepserve.metrics.summary import timeseries as summary_timeseries


def record(index, *, start=None, dur=0.01, prefill=0, decode=0, ready=0, running=0,
           waiting=0, swapped=0, preempted=0, kv=0.0, held=0, active=0):
    """One step record; starts at index * dur unless `start` is given."""
    return StepRecord(index=index, start_s=index * dur if start is None else start,
                      duration_s=dur, num_prefill_tokens=prefill, num_decode_tokens=decode,
                      num_scheduled_seqs=running, num_decode_ready=ready, num_running=running,
                      num_waiting=waiting, num_swapped=swapped, num_preempted=preempted,
                      kv_usage=kv, slots_held=held, num_active=active)


def static_batch_of_64():
    """The night-report incident's job: 64 slots, 10 x 2000 + 54 x 20 output tokens. Step 0
    prefills all 64 (each samples its first token); after step 19 only 10 are left."""
    steps = [record(0, prefill=64 * 4, held=64, active=64, running=64)]
    for i in range(1, 2000):
        alive = 64 if i < 20 else 10
        steps.append(record(i, decode=alive, ready=alive, held=64, active=alive, running=alive))
    return steps


def test_slot_utilization_of_the_seeds_static_batch():
    s = step_summary(static_batch_of_64())
    # useful output / (concurrency x longest output) = 21,080 / (64 x 2,000)
    assert s.slot_utilization == pytest.approx(21080 / 128000)
    assert round(s.slot_utilization, 4) == 0.1647
    assert s.active_ratio_p50 == pytest.approx(10 / 64)  # the incident's "10 of 64"
    assert s.active_ratio_mean == pytest.approx(21080 / 128000)
    assert s.steps == 2000 and s.mean_step_s == pytest.approx(0.01)
    assert s.running_max == 64


def test_steps_without_held_slots_are_left_out_of_slot_utilization():
    steps = [record(0, held=4, active=2, decode=2), record(1, held=0, active=0)]
    s = step_summary(steps)
    assert s.slot_utilization == pytest.approx(0.5)
    assert s.active_ratio_p50 == pytest.approx(0.5)


def test_prefill_only_and_zero_decode_step_shares():
    steps = (
        [record(i, prefill=512, ready=0) for i in range(3)]  # prefill-only, nothing to decode
        + [record(i, prefill=512, ready=4) for i in range(3, 5)]  # decode starved
        + [record(i, prefill=100, decode=4, ready=4) for i in range(5, 9)]  # mixed
        + [record(9, decode=4, ready=4)]  # decode-only
    )
    s = step_summary(steps)
    assert s.prefill_step_share == pytest.approx(5 / 10)
    assert s.zero_decode_step_share == pytest.approx(2 / 10)
    prefill, decode = 5 * 512 + 4 * 100, 5 * 4
    assert s.prefill_token_share == pytest.approx(prefill / (prefill + decode))
    assert s.decode_step_p50_s == pytest.approx(0.01)


def test_no_steps_gives_none_not_errors():
    s = step_summary([])
    assert s.steps == 0 and s.replicas == 0
    for key in ("slot_utilization", "prefill_step_share", "zero_decode_step_share",
                "waiting_max", "waiting_growth", "kv_usage_max", "mean_step_s"):
        assert getattr(s, key) is None


def test_longest_monotonic_rise_trims_flat_ends():
    vs = [0, 1, 2, 2, 3, 1, 2, 3, 4, 5, 6, 6, 0]
    ts = [float(i) for i in range(len(vs))]
    assert longest_monotonic_rise(ts, vs) == (5.0, 5)  # from t=5 (level 1) to t=10 (6)
    assert longest_monotonic_rise([0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 1, 2]) == (2, 2)
    assert longest_monotonic_rise([0, 1, 2], [3, 2, 1]) == (0.0, 0)


def test_waiting_growth_is_fitted_while_requests_arrive():
    # waiting rises 2 per second for 10 s of arrivals, then drains for 10 s
    steps = [record(i, start=float(i), dur=1.0, waiting=2 * (i + 1)) for i in range(10)]
    steps += [record(i, start=float(i), dur=1.0, waiting=max(20 - 2 * (i - 9), 0))
              for i in range(10, 20)]
    s = step_summary(steps, offered_window=(0.0, 10.0))
    assert s.waiting_growth == pytest.approx(2.0)
    assert s.waiting_trend_rise == pytest.approx(18.0)  # slope x (10 s - 1 s) of samples
    assert s.waiting_monotonic_rise_s == pytest.approx(9.0)
    assert s.waiting_monotonic_rise == 18
    assert s.waiting_max == 20
    assert step_summary(steps).waiting_growth is None  # no arrival window, no fit
    assert step_summary(steps, offered_window=(0.0, 0.0)).waiting_growth is None


def test_queue_levels_are_summed_over_replicas():
    a = [record(0, start=0.0, dur=1.0, waiting=2, running=3, kv=0.2),
         record(1, start=2.0, dur=1.0, waiting=4, running=3, kv=0.4)]
    b = [record(0, start=1.0, dur=1.0, waiting=1, running=5, kv=0.6),
         record(1, start=3.0, dur=1.0, waiting=0, running=5, kv=0.8)]
    s = step_summary([a, b])
    # after each step (t = 1, 2, 3, 4): waiting 2, 2+1, 4+1, 4+0
    assert s.replicas == 2
    assert s.waiting_max == 5 and s.waiting_p50 == pytest.approx(3.5)
    assert s.running_max == 8
    assert s.kv_usage_max == pytest.approx(0.8)
    assert s.kv_usage_mean == pytest.approx(0.5)
    assert s.waiting_nonzero_share == 1.0
    assert s.in_engine_max == 13


def test_timeseries_bins_levels_and_totals():
    steps = [record(0, start=0.0, dur=0.4, waiting=4, running=2, kv=0.5, prefill=100),
             record(1, start=0.4, dur=0.4, waiting=2, running=4, kv=0.7, decode=4,
                    preempted=1),
             record(2, start=0.8, dur=3.2, waiting=0, running=1, kv=0.1, decode=1)]
    ts = timeseries(steps, bins=4)  # span 0..4 s, 1 s per bin, binned by each step's end
    assert ts.t == pytest.approx([0.5, 1.5, 2.5, 3.5])
    assert ts.waiting == pytest.approx([3, 3, 3, 0])  # mean of bin 0, carried to 1 and 2
    assert ts.running == pytest.approx([3, 3, 3, 1])
    assert ts.kv_usage == pytest.approx([0.6, 0.6, 0.6, 0.1])
    assert ts.prefill_tokens == [100, 0, 0, 0]
    assert ts.decode_tokens == [4, 0, 0, 1]
    assert ts.preemptions == [1, 0, 0, 0]
    assert set(ts.to_json()) == {"t", "waiting", "running", "kv_usage", "prefill_tokens",
                                 "decode_tokens", "preemptions"}
    assert TimeSeries.from_json(ts.to_json()) == ts
    assert timeseries([]).t == []
    assert summary_timeseries is timeseries
    with pytest.raises(ValueError, match="bins"):
        timeseries(steps, bins=0)


def test_summarize_has_every_key_other_tools_rely_on():
    s = summarize([], static_batch_of_64(), 20.0)
    required = {
        "requests_total", "requests_finished", "requests_rejected", "requests_timed_out",
        "requests_aborted", "output_tokens", "prompt_tokens", "duration_s",
        "throughput_tokens_per_s", "throughput_requests_per_s", "preemptions",
        "preempted_requests", "preemptions_on_long_share", "swapped_blocks",
        "recomputed_tokens", "slot_utilization", "active_ratio_p50", "active_ratio_mean",
        "prefill_step_share", "zero_decode_step_share", "prefill_token_share", "steps",
        "mean_step_s", "waiting_max", "waiting_p50", "waiting_growth",
        "waiting_monotonic_rise_s", "kv_usage_max", "kv_usage_mean", "running_max",
        "running_mean", "p99_p50_e2e_ratio", "p99_p50_ttft_ratio",
    }
    required |= {f"{n}_{stat}_s" for n in ("ttft", "tpot", "itl", "e2e", "queue_time")
                 for stat in ("mean", "p50", "p95", "p99")}
    assert required <= set(s.to_json())


def _record(i: int, prefill: int, decode: int, ready: int) -> StepRecord:
    return StepRecord(index=i, start_s=i * 0.01, duration_s=0.01, num_prefill_tokens=prefill,
                      num_decode_tokens=decode, num_scheduled_seqs=1, num_decode_ready=ready,
                      num_running=ready, num_waiting=0, num_swapped=0, num_preempted=0,
                      kv_usage=0.1, slots_held=max(ready, 1), num_active=decode)


def test_one_step_classification_for_live_metrics_and_summaries():
    pytest.importorskip("prometheus_client")
    from stepserve.server.metrics import ServerMetrics

    records = [_record(0, 512, 0, 0), _record(1, 512, 0, 3), _record(2, 100, 3, 3),
               _record(3, 0, 4, 4), _record(4, 0, 0, 0)]
    assert [r.kind for r in records] == ["prefill_only", "prefill_only", "mixed",
                                         "decode_only", "empty"]
    assert [r.is_zero_decode for r in records] == [False, True, False, False, False]
    live = ServerMetrics("m")
    live.on_steps(records)
    summary = step_summary(records)
    samples = {m.name: m.samples[0].value for m in live.registry.collect() if m.samples}
    assert summary.prefill_step_share == pytest.approx(2 / 5)
    assert summary.zero_decode_step_share == pytest.approx(1 / 5)
    assert samples["stepserve:prefill_step_share"] == pytest.approx(summary.prefill_step_share)
    assert samples["stepserve:zero_decode_step_share"] == pytest.approx(
        summary.zero_decode_step_share)
