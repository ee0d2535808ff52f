"""Metric definitions on hand-built token timelines, SLO parsing, Prometheus parsing."""

from __future__ import annotations

import pytest

from stepserve.bench.client import RequestRecord
from stepserve.bench.loadgen import scrape_summary
from stepserve.bench.results import (
    GoodputError,
    GoodputSLO,
    e2e_s,
    itl_s,
    parse_goodput,
    peak_concurrency,
    summarize_records,
    tpot_s,
    ttft_s,
)
from stepserve.metrics.prometheus import Snapshot, parse_prometheus


def rec(index: int, send: float, times: list[float], tokens: int | None = None,
        reason: str | None = "length", **kw) -> RequestRecord:
    end = times[-1] if times else send
    return RequestRecord(index=index, send_s=send, end_s=kw.pop("end", end),
                         chunk_times_s=list(times), output_tokens=tokens,
                         finish_reason=reason, status=kw.pop("status", 200), **kw)


def test_vllm_definitions_on_a_timeline():
    r = rec(0, 1.0, [1.5, 1.6, 1.8, 2.1], tokens=4)
    assert ttft_s(r) == pytest.approx(0.5)
    assert e2e_s(r) == pytest.approx(1.1)
    assert tpot_s(r) == pytest.approx((1.1 - 0.5) / 3)
    assert itl_s(r) == pytest.approx([0.1, 0.2, 0.3])


def test_tpot_uses_usage_tokens_not_chunks():
    # 2 chunks carried 5 tokens: TPOT divides by 4, ITL has the one chunk gap
    r = rec(0, 0.0, [0.2, 1.0], tokens=5)
    assert tpot_s(r) == pytest.approx(0.8 / 4)
    assert itl_s(r) == pytest.approx([0.8])


def test_one_token_has_no_tpot():
    r = rec(0, 0.0, [0.3], tokens=1)
    assert tpot_s(r) is None and ttft_s(r) == pytest.approx(0.3)


def test_summary_percentiles_and_failures():
    records = [rec(0, 0.0, [0.1, 0.2], tokens=2), rec(1, 0.0, [0.3, 0.5], tokens=2),
               rec(2, 0.1, [], reason=None, status=500, error="HTTP 500: boom", end=0.2),
               rec(3, 0.0, [0.05, 0.1], tokens=2, warmup=True)]
    s = summarize_records(records)
    assert s.requests_total == 3 and s.requests_finished == 2
    assert s.requests_failed == 1 and s.errors == {"http_500": 1}
    assert s.output_tokens == 4
    assert s.ttft_mean_s == pytest.approx(0.2)
    assert s.ttft_p50_s == pytest.approx(0.2)  # numpy linear between 0.1 and 0.3
    assert s.itl_p99_s == pytest.approx(0.1 + 0.1 * 0.99)
    assert s.duration_s == pytest.approx(0.5)
    assert s.throughput_tokens_per_s == pytest.approx(8.0)
    assert s.warmup_requests == 1
    assert s.goodput_requests_per_s is None  # no SLO given


def test_goodput_counts_only_requests_meeting_every_slo():
    fast = rec(0, 0.0, [0.1, 0.2, 0.3], tokens=3)  # ttft .1, tpot .1, e2e .3
    slow_first = rec(1, 0.0, [0.6, 0.7, 0.8], tokens=3)  # ttft .6
    slow_decode = rec(2, 0.0, [0.1, 0.9, 1.0], tokens=3)  # tpot .45
    failed = rec(3, 0.0, [0.1], reason=None, error="stream error: x")
    slo = parse_goodput("ttft:500 tpot:200")
    s = summarize_records([fast, slow_first, slow_decode, failed], slo)
    assert s.goodput_requests == 1
    assert s.goodput_requests_per_s == pytest.approx(1 / s.duration_s)
    assert summarize_records([fast, slow_first],
                             parse_goodput("e2el:900")).goodput_requests == 2


def test_peak_concurrency():
    rs = [rec(0, 0.0, [1.0]), rec(1, 0.5, [2.0]), rec(2, 1.0, [1.5]), rec(3, 3.0, [4.0])]
    assert peak_concurrency(rs) == 2  # 0 ends at 1.0 as 2 starts


def test_goodput_parsing():
    assert parse_goodput("ttft:500 tpot:50 e2el:2000") == GoodputSLO(0.5, 0.05, 2.0)
    assert parse_goodput(["ttft:500", "e2el:3000"]) == GoodputSLO(0.5, None, 3.0)
    with pytest.raises(GoodputError, match=r"'latency:5'.*unknown key 'latency'.*ttft, tpot, e2el"):
        parse_goodput("latency:5")
    with pytest.raises(GoodputError, match=r"'ttft:fast'.*not a number"):
        parse_goodput("ttft:fast")
    with pytest.raises(GoodputError, match="KEY:MILLISECONDS"):
        parse_goodput("ttft")
    with pytest.raises(GoodputError, match="positive"):
        parse_goodput("tpot:-1")


PROM = """# HELP vllm:num_requests_waiting x
vllm:num_requests_waiting{model_name="m"} 3.0
vllm:num_requests_running{model_name="m"} 5.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
vllm:num_preemptions_total{model_name="m"} 2.0
vllm:generation_tokens_total{model_name="m"} 100.0
vllm:request_success_total{finished_reason="stop",model_name="m"} 4.0
vllm:request_success_total{finished_reason="abort",model_name="m"} 1.0
"""


def test_prometheus_parse_and_vllm_names():
    samples = parse_prometheus(PROM)
    assert samples[("vllm:num_requests_waiting", frozenset({("model_name", "m")}))] == 3.0
    before = Snapshot(0.0, samples)
    after = Snapshot(1.0, parse_prometheus(
        PROM.replace("} 3.0", "} 7.0").replace("} 100.0", "} 160.0")
        .replace('stop",model_name="m"} 4.0', 'stop",model_name="m"} 9.0')))
    s = scrape_summary([before, after])
    assert s["metrics_source"] == "vllm"
    assert s["waiting_max"] == 7.0 and s["running_max"] == 5.0 and s["kv_usage_max"] == 0.25
    assert s["server_generation_tokens"] == 60.0
    assert s["server_requests_finished"] == 5.0  # abort not counted
    assert s["preemptions"] == 0.0
    assert s["waiting_growth"] == pytest.approx(4.0) and s["waiting_nonzero_share"] == 1.0


@pytest.mark.parametrize("before, after, source", [
    ("sglang:num_queue_reqs 1\nsglang:num_running_reqs 4\nsglang:token_usage 0.5\n"
     "sglang:num_retracted_requests_total 1\nsglang:generation_tokens_total 10\n"
     "sglang:prompt_tokens_total 5\nsglang:num_requests_total 2\n",
     "sglang:num_queue_reqs 3\nsglang:num_running_reqs 2\nsglang:token_usage 0.75\n"
     "sglang:num_retracted_requests_total 4\nsglang:generation_tokens_total 70\n"
     "sglang:prompt_tokens_total 25\nsglang:num_requests_total 6\n", "sglang"),
    ("tgi_queue_size 1\ntgi_batch_current_size 4\ntgi_request_success 2\n"
     "tgi_request_generated_tokens_sum 10\ntgi_request_input_length_sum 5\n",
     "tgi_queue_size 3\ntgi_batch_current_size 2\ntgi_request_success 6\n"
     "tgi_request_generated_tokens_sum 70\ntgi_request_input_length_sum 25\n", "tgi"),
])
def test_scrape_reads_sglang_and_tgi_names(before, after, source):
    a, b = Snapshot(0.0, parse_prometheus(before)), Snapshot(2.0, parse_prometheus(after))
    assert (b.level("waiting"), b.level("running")) == (3.0, 2.0)
    assert b.counter("generation_tokens") == 70.0
    s = scrape_summary([a, b])
    assert s["metrics_source"] == source
    assert s["waiting_max"] == 3.0 and s["running_max"] == 4.0
    assert s["waiting_growth"] == pytest.approx(1.0) and s["waiting_trend_rise"] == 2.0
    assert s["server_generation_tokens"] == 60.0 and s["server_prompt_tokens"] == 20.0
    assert s["server_requests_finished"] == 4.0
    if source == "sglang":
        assert s["kv_usage_max"] == 0.75 and s["preemptions"] == 3.0
    else:  # TGI exposes neither
        assert s["kv_usage_max"] is None and s["preemptions"] is None
        assert b.level("kv_usage") is None


def _step_histogram(counts: dict[float, int], total_s: float) -> str:
    lines, cumulative = [], 0
    for le, n in counts.items():
        cumulative += n
        bound = "+Inf" if le == float("inf") else repr(le)
        lines.append(f'stepserve:step_duration_seconds_bucket{{le="{bound}",model_name="m"}} '
                     f"{cumulative}")
    lines += [f'stepserve:step_duration_seconds_sum{{model_name="m"}} {total_s}',
              f'stepserve:step_duration_seconds_count{{model_name="m"}} {cumulative}',
              'stepserve:num_requests_waiting{model_name="m"} 0']
    return "\n".join(lines) + "\n"


def test_the_step_times_of_a_run_reach_the_doctor():
    """A bench run against our server: the step-time histogram's increase over the run
    gives the step quantiles, and with the client's numbers the doctor names a prefill
    stall (3 steps of ~8 s among 200 of ~0.15 s, as the CPU prefill-wave bench saw)."""
    before = Snapshot(0.0, parse_prometheus(_step_histogram(
        {0.2: 10, 10.0: 0, float("inf"): 0}, 1.5)))
    after = Snapshot(60.0, parse_prometheus(_step_histogram(
        {0.2: 210, 10.0: 3, float("inf"): 0}, 1.5 + 30.0 + 24.0)))
    s = scrape_summary([before, after])
    assert s["step_p50_s"] == pytest.approx(0.1, rel=0.05)  # inside the first bucket
    assert 0.2 < s["step_p99_s"] <= 10.0
    assert s["mean_step_s"] == pytest.approx(54.0 / 203)
    from stepserve.metrics.rules import prefill_stalls_decode
    from stepserve.metrics.run_summary import RunSummary

    summary = RunSummary.of(**{k: v for k, v in s.items() if k in SCRAPE_FIELDS},
                            tpot_p50_s=0.15, prompt_tokens=12288, output_tokens=6144,
                            ttft_p50_s=8.5)
    found = prefill_stalls_decode(summary)
    assert found is not None and "step time P99" in found.evidence


SCRAPE_FIELDS = ("mean_step_s", "step_p50_s", "step_p99_s", "waiting_max")
