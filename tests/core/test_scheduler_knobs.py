"""Every scheduler knob changes behaviour; each test shows how."""

import pytest
from factories import FakeRunner, make_requests, make_scheduler, run_until_done, step

from stepserve.config.settings import ConfigError
from stepserve.core.request import FinishReason, RejectReason, RequestStatus


def add_all(sched, reqs):
    for r in reqs:
        sched.add_request(r)


def test_max_num_seqs_caps_the_running_batch():
    for cap in (2, 5):
        sched = make_scheduler(max_num_seqs=cap)
        add_all(sched, make_requests(8, prompt_len=4, max_tokens=6))
        outs = run_until_done(sched)
        assert max(len(o.requests) for o in outs) == cap
        assert all(r.finish_reason is FinishReason.LENGTH for r in sched.finished)


def test_max_num_batched_tokens_caps_each_step():
    for budget, expect_first in ((16, 16), (64, 64)):
        sched = make_scheduler(max_num_batched_tokens=budget, max_num_partial_prefills=8,
                               max_long_partial_prefills=8)
        add_all(sched, make_requests(10, prompt_len=10, max_tokens=3))
        outs = run_until_done(sched)
        assert outs[0].total_num_scheduled_tokens == expect_first
        assert max(o.total_num_scheduled_tokens for o in outs) <= budget


def test_chunked_prefill_splits_a_prompt_and_without_it_prompts_go_whole():
    chunked = make_scheduler(max_num_batched_tokens=128, max_model_len=128)
    add_all(chunked, make_requests(2, prompt_len=100, max_tokens=2))
    first = step(chunked)
    assert first.num_scheduled_tokens == [100, 28]  # the second prompt starts in chunks
    whole = make_scheduler(max_num_batched_tokens=128, max_model_len=128,
                           enable_chunked_prefill=False)
    add_all(whole, make_requests(2, prompt_len=100, max_tokens=2))
    first = step(whole)
    assert first.num_scheduled_tokens == [100]  # the second waits for a whole step


def test_long_prefill_token_threshold_caps_one_request_per_step():
    sched = make_scheduler(max_num_batched_tokens=256, long_prefill_token_threshold=16)
    add_all(sched, make_requests(1, prompt_len=100, max_tokens=1))
    outs = run_until_done(sched)
    assert [o.num_prefill_tokens for o in outs] == [16] * 6 + [4]


def test_max_num_partial_prefills_limits_prompts_mid_prefill():
    def first_step_prefills(partial):
        sched = make_scheduler(max_num_batched_tokens=256, long_prefill_token_threshold=16,
                               max_num_partial_prefills=partial,
                               max_long_partial_prefills=partial)
        add_all(sched, make_requests(4, prompt_len=100, max_tokens=1))
        return len(step(sched).requests)

    assert first_step_prefills(1) == 1
    assert first_step_prefills(3) == 3


def test_max_long_partial_prefills_lets_short_prompts_pass_long_ones():
    sched = make_scheduler(max_num_batched_tokens=256, long_prefill_token_threshold=16,
                           max_num_partial_prefills=4, max_long_partial_prefills=1)
    add_all(sched, make_requests(3, prompt_len=100, max_tokens=1, prefix="long"))
    add_all(sched, make_requests(2, prompt_len=8, max_tokens=1, prefix="short"))
    out = step(sched)
    ids = [r.request_id for r in out.requests]
    assert ids == ["long0", "short0", "short1"]


def test_max_model_len_rejects_with_a_reason_naming_both_numbers():
    sched = make_scheduler(max_model_len=64)
    (r,) = make_requests(1, prompt_len=60, max_tokens=10)
    assert not sched.add_request(r)
    assert r.status is RequestStatus.FINISHED_REJECTED
    assert "60" in r.finish_message and "70" in r.finish_message and "64" in r.finish_message
    assert r.reject_reason is RejectReason.TOO_LONG
    assert sched.finished == [r] and not sched.has_unfinished()


def test_budget_order_prefill_first_starves_decode_when_chunk_cap_equals_budget():
    def run(order):
        sched = make_scheduler(max_num_batched_tokens=64, long_prefill_token_threshold=64,
                               budget_order=order, max_num_partial_prefills=4,
                               max_long_partial_prefills=4)
        (chat,) = make_requests(1, prompt_len=4, max_tokens=50, prefix="chat")
        sched.add_request(chat)
        step(sched)  # chat prefilled, now decoding
        add_all(sched, make_requests(4, prompt_len=64, max_tokens=1, prefix="doc"))
        return [step(sched) for _ in range(4)]

    starved = run("prefill_first")
    assert [o.num_decode_tokens for o in starved] == [0, 0, 0, 0]
    assert all(o.num_decode_ready == 1 for o in starved)
    served = run("decode_first")
    assert [o.num_decode_tokens for o in served] == [1, 1, 1, 1]


def test_an_empty_prompt_is_rejected_with_its_reason():
    sched = make_scheduler()
    (r,) = make_requests(1, prompt_len=0)
    assert not sched.add_request(r)
    assert r.reject_reason is RejectReason.EMPTY_PROMPT and "empty" in r.finish_message
    assert r.finish_reason is FinishReason.REJECTED and not sched.has_unfinished()


def test_max_waiting_rejects_over_the_cap():
    sched = make_scheduler(max_waiting=3)
    reqs = make_requests(5)
    accepted = [sched.add_request(r) for r in reqs]
    assert accepted == [True, True, True, False, False]
    assert "max_waiting = 3" in reqs[3].finish_message
    assert [r.reject_reason for r in reqs] == [None] * 3 + [RejectReason.QUEUE_FULL] * 2
    run_until_done(sched)
    assert len(sched.finished) == 5


def test_max_queue_time_times_out_waiting_requests():
    sched = make_scheduler(max_num_seqs=1, max_queue_time_s=0.05)
    add_all(sched, make_requests(3, max_tokens=20))
    run_until_done(sched, FakeRunner(step_s=0.01))
    reasons = [r.finish_reason for r in sorted(sched.finished, key=lambda r: r.request_id)]
    assert reasons == [FinishReason.LENGTH, FinishReason.TIMED_OUT, FinishReason.TIMED_OUT]
    assert "max_queue_time_s" in sched.finished[0].finish_message
    sched.kv.check_integrity()
    assert sched.kv.all_free


def test_config_rejects_contradictions_with_clear_messages():
    with pytest.raises(ConfigError, match="long_prefill_token_threshold = 9000"):
        make_scheduler(max_num_batched_tokens=8192, long_prefill_token_threshold=9000)
    with pytest.raises(ConfigError, match="max_num_seqs = 0"):
        make_scheduler(max_num_seqs=0)
    with pytest.raises(ConfigError, match="cannot hold one sequence"):
        make_scheduler(num_gpu_blocks=4, max_model_len=2048)


def test_dynamic_batch_runs_at_the_wakeup_time_it_names():
    # (a + w) - a < w in floats for this arrival: the batch must still close at the
    # wake-up time, or a simulator waking there would wake there forever.
    from stepserve.core.clock import VirtualClock

    arrival, window = 952.8149084371281, 0.05
    assert (arrival + window) - arrival < window
    clock = VirtualClock()
    sched = make_scheduler(batching="dynamic", batch_window_s=window, max_num_seqs=8,
                           clock=clock)
    (req,) = make_requests(1, arrival=arrival)
    sched.add_request(req)
    wake = sched.next_wakeup_time()
    clock.advance(wake - clock.now())
    assert clock.now() == wake
    assert [r.request_id for r in sched.schedule().requests] == ["r0"]
