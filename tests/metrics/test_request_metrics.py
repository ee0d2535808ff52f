"""Per-request latencies on hand-built token timelines, and the request keys of a summary."""

import pytest

from stepserve.core.end_reasons import FINISH_REASON_OF, RequestStatus
from stepserve.core.request import Request, SamplingParams
from stepserve.metrics import summary as summaries
from stepserve.metrics.request_metrics import request_metrics
from stepserve.metrics.summary import LATENCIES, summarize, summarize_by_class

LENGTH, STOP = RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_STOPPED


def timed_request(rid, arrival, token_times, *, scheduled=None, status=LENGTH,
                  finish_time=None, prompt_len=4, request_class="", preemptions=0):
    """A request that arrived at `arrival` and got one token at each of `token_times`."""
    req = Request(request_id=rid, prompt_token_ids=[1] * prompt_len,
                  sampling_params=SamplingParams(max_tokens=max(len(token_times), 1)),
                  arrival_time=arrival, request_class=request_class)
    req.output_token_ids = [7] * len(token_times)
    req.token_times = list(token_times)
    if scheduled is None and token_times:
        scheduled = arrival
    req.first_scheduled_time = scheduled
    req.status = status
    req.num_preemptions = preemptions
    if status.is_finished:
        req.finish_reason = FINISH_REASON_OF[status]
        req.finish_time = finish_time if finish_time is not None else \
            (token_times[-1] if token_times else arrival)
    return req


def request_summary(reqs, duration_s, **kw):
    """The request fields of the requests, each measured."""
    return summaries.request_summary([request_metrics(r) for r in reqs], duration_s, **kw)


def test_vllm_definitions_on_a_hand_built_timeline():
    req = timed_request("a", 1.0, [2.0, 2.1, 2.3, 2.6], scheduled=1.5)
    m = request_metrics(req)
    assert m.ttft_s == pytest.approx(1.0)
    assert m.e2e_s == pytest.approx(1.6)
    assert m.tpot_s == pytest.approx((1.6 - 1.0) / (4 - 1))  # (E2E - TTFT) / (output - 1)
    assert m.itl_s == pytest.approx((0.1, 0.2, 0.3))
    assert m.queue_time_s == pytest.approx(0.5)
    assert m.completed and m.num_output_tokens == 4
    assert m.tpot_s == pytest.approx(sum(m.itl_s) / len(m.itl_s))  # the mean gap


def test_one_token_has_ttft_but_no_tpot_or_itl():
    m = request_metrics(timed_request("a", 0.0, [0.25]))
    assert m.ttft_s == pytest.approx(0.25) and m.e2e_s == pytest.approx(0.25)
    assert m.tpot_s is None and m.itl_s == ()


def test_no_token_uses_the_finish_time_for_e2e():
    req = timed_request("a", 1.0, [], status=RequestStatus.FINISHED_TIMED_OUT,
                        finish_time=4.0)
    m = request_metrics(req)
    assert m.ttft_s is None and m.queue_time_s is None and not m.scheduled
    assert m.e2e_s == pytest.approx(3.0) and not m.completed
    assert request_metrics(timed_request("b", 1.0, [], status=RequestStatus.WAITING)).e2e_s \
        is None


def test_only_completed_requests_feed_the_latency_percentiles():
    reqs = [
        timed_request("ok1", 0.0, [1.0, 1.5, 2.0]),
        timed_request("ok2", 0.0, [2.0, 2.5], status=STOP),
        timed_request("rej", 0.0, [], status=RequestStatus.FINISHED_REJECTED),
        timed_request("late", 0.0, [], status=RequestStatus.FINISHED_TIMED_OUT,
                      finish_time=9.0),
        timed_request("gone", 0.0, [50.0, 90.0], status=RequestStatus.FINISHED_ABORTED),
        timed_request("live", 0.0, [3.0], status=RequestStatus.RUNNING),
    ]
    s = request_summary(reqs, duration_s=10.0)
    assert (s.requests_total, s.requests_finished, s.requests_rejected,
            s.requests_timed_out, s.requests_aborted, s.requests_unfinished) == \
        (6, 2, 1, 1, 1, 1)
    assert s.output_tokens == 3 + 2 + 2 + 1  # every generated token, any outcome
    assert s.prompt_tokens == 4 * 4  # prompts of the four that ran
    assert s.throughput_tokens_per_s == pytest.approx(0.8)
    assert s.throughput_requests_per_s == pytest.approx(0.2)
    assert s.ttft_p50_s == pytest.approx(1.5) and s.ttft_p99_s == pytest.approx(1.99)
    assert s.e2e_mean_s == pytest.approx(2.25)
    assert s.itl_mean_s == pytest.approx(0.5) and s.itl_p99_s == pytest.approx(0.5)
    assert s.tpot_p50_s == pytest.approx(0.5)
    assert s.itl_max_s == pytest.approx(0.5)  # the longest gap of a completed request
    for name in LATENCIES:
        for stat in ("mean", "p50", "p95", "p99"):
            assert f"{name}_{stat}_s" in s.to_json()


def test_latency_keys_are_none_without_completed_requests():
    s = request_summary([timed_request("r", 0.0, [], status=RequestStatus.FINISHED_REJECTED)],
                        duration_s=0.0)
    assert s.ttft_p50_s is None and s.p99_p50_e2e_ratio is None
    assert s.throughput_tokens_per_s is None  # zero duration
    with pytest.raises(ValueError, match="duration_s"):
        request_summary([], duration_s=-1.0)


def test_p99_p50_ratios():
    reqs = [timed_request(f"r{i}", 0.0, [1.0, 2.0]) for i in range(99)]
    reqs.append(timed_request("slow", 0.0, [100.0, 200.0]))
    s = request_summary(reqs, 200.0)
    assert s.p99_p50_ttft_ratio == pytest.approx(s.ttft_p99_s / s.ttft_p50_s)
    assert s.p99_p50_e2e_ratio == pytest.approx((2.0 + 0.01 * 198.0) / 2.0)  # rank 98.01


def test_preemptions_on_long_requests_share():
    def with_output(rid, n, preemptions):
        return timed_request(rid, 0.0, [0.01 * (i + 1) for i in range(n)],
                             preemptions=preemptions)

    reqs = [with_output("long", 1300, 3), with_output("edge", 1200, 0),
            with_output("short", 20, 1), with_output("calm", 20, 0)]
    s = request_summary(reqs, 20.0)
    assert s.preemptions == 4 and s.preempted_requests == 2
    assert s.preemptions_on_long_share == pytest.approx(0.75)
    assert s.long_requests == 1 and s.long_request_share == pytest.approx(0.25)
    s = request_summary(reqs, 20.0, long_request_threshold=10)
    assert s.preemptions_on_long_share == 1.0
    calm = request_summary([with_output("calm", 20, 0)], 1.0)
    assert calm.preemptions == 0 and calm.preemptions_on_long_share is None


def test_summarize_by_class_splits_request_keys_and_omits_step_keys():
    reqs = [timed_request("c1", 0.0, [0.1, 0.2], request_class="chat"),
            timed_request("c2", 0.0, [0.3, 0.4], request_class="chat"),
            timed_request("s1", 0.0, [2.0, 3.0], request_class="summary"),
            timed_request("x", 0.0, [1.0])]
    by = summarize_by_class(reqs, [], 4.0)
    assert list(by) == ["chat", "summary", "unclassified"]
    assert by["chat"].requests_total == 2 and by["chat"].ttft_p50_s == pytest.approx(0.2)
    assert by["summary"].ttft_p50_s == pytest.approx(2.0)
    chat = by["chat"].to_json()
    assert "slot_utilization" not in chat and "steps" not in chat
    whole = summarize(reqs, [], 4.0)
    assert whole.steps == 0 and whole.slot_utilization is None
    assert set(chat) < set(whole.to_json())
