"""The real schedulers, driven by the shared factories, summarised end to end."""

import json

import pytest
from factories import FakeRunner, make_requests, make_scheduler, run_until_done, step

from stepserve.config.settings import EngineConfig
from stepserve.metrics import RunSummary, diagnose, summarize, summarize_by_class, timeseries
from stepserve.metrics.rules import RuleSettings
from stepserve.sim.cost import ConstantCost
from stepserve.sim.loop import simulate
from stepserve.workload.spec import RequestSpec


def rules_on(s: RunSummary, config: dict) -> set[str]:
    """The rules that fire on a summary with a run's config."""
    return {f.rule for f in diagnose(s, RuleSettings.of(s, config))}


def run(sched, reqs, runner=None):
    for r in reqs:
        sched.add_request(r)
    run_until_done(sched, runner)
    return summarize(sched.finished, sched.step_records, sched.clock.now())


def test_continuous_run_summary_is_consistent_and_healthy():
    sched = make_scheduler(max_num_seqs=16)
    s = run(sched, make_requests(12, prompt_len=8, max_tokens=10))
    assert s.requests_total == s.requests_finished == 12
    assert s.output_tokens == 120 and s.prompt_tokens == 96
    assert s.steps == len(sched.step_records) == 10
    assert s.duration_s == pytest.approx(0.10)
    assert s.throughput_tokens_per_s == pytest.approx(1200.0)
    # FakeRunner: 0.01 s per step; everyone prefills in step 1 and decodes every step
    assert s.ttft_p50_s == pytest.approx(0.01) and s.ttft_p99_s == pytest.approx(0.01)
    assert s.tpot_p50_s == pytest.approx(0.01) and s.itl_p99_s == pytest.approx(0.01)
    assert s.e2e_p99_s == pytest.approx(0.10) and s.queue_time_p99_s == 0.0
    assert s.slot_utilization == pytest.approx(1.0)
    assert s.prefill_step_share == pytest.approx(0.1)
    assert s.zero_decode_step_share == 0.0
    assert s.preemptions == 0 and s.preemptions_on_long_share is None
    assert s.waiting_max == 0 and s.running_max == 12
    assert 0 < s.kv_usage_max <= 1
    assert rules_on(s, {"batching": "continuous"}) == set()


def test_recompute_preemption_is_counted_and_diagnosed():
    sched = make_scheduler(num_gpu_blocks=16, max_model_len=256, max_num_seqs=8)
    s = run(sched, make_requests(8, prompt_len=16, max_tokens=48))
    assert s.requests_finished == 8
    assert s.preemptions == sched.num_preemptions_total > 0
    assert s.preempted_requests > 0 and s.recomputed_tokens > 0
    assert s.swapped_blocks == 0
    # re-prefill covers what was computed, plus the pending token of a decoding victim
    base = 8 * 16 + s.recomputed_tokens
    assert base <= s.prefill_tokens_computed <= base + s.preemptions
    assert "preemption_nonzero" in [f.rule for f in diagnose(s)]


def test_swap_preemption_counts_swapped_blocks():
    sched = make_scheduler(num_gpu_blocks=16, max_model_len=256, max_num_seqs=8,
                           preemption_mode="swap", num_cpu_blocks=64)
    s = run(sched, make_requests(8, prompt_len=16, max_tokens=48))
    assert s.requests_finished == 8 and s.preemptions > 0
    assert s.swapped_blocks > 0


def test_static_batch_of_64_reproduces_the_seeds_slot_utilisation():
    sched = make_scheduler(num_gpu_blocks=4096, batching="static", max_num_seqs=64,
                           max_model_len=2048 + 16)
    reqs = make_requests(10, prompt_len=4, max_tokens=2000, prefix="long") + \
        make_requests(54, prompt_len=4, max_tokens=20, prefix="short")
    s = run(sched, reqs)
    assert s.output_tokens == 21080 and s.steps == 2000
    assert s.slot_utilization == pytest.approx(21080 / (64 * 2000))
    assert round(s.slot_utilization, 4) == 0.1647
    assert s.active_ratio_p50 == pytest.approx(10 / 64)
    assert s.long_requests == 10
    rules = rules_on(s, {"batching": "static"})
    assert rules == {"low_slot_utilization", "low_active_ratio"}


def test_rejected_and_timed_out_requests_are_counted_not_timed():
    sched = make_scheduler(max_waiting=3, max_num_seqs=1, max_queue_time_s=0.05)
    s = run(sched, make_requests(5, prompt_len=4, max_tokens=10))
    assert s.requests_rejected == 2  # the queue held 3
    assert s.requests_timed_out == 2  # behind a 0.1 s request, over 0.05 s
    assert s.requests_finished == 1
    assert s.ttft_p99_s == pytest.approx(0.01)  # only the one that ran


def test_chunk_cap_equal_to_budget_starves_decode_under_prefill_first():
    sched = make_scheduler(max_num_batched_tokens=64, max_model_len=512,
                           budget_order="prefill_first", max_num_partial_prefills=4,
                           max_long_partial_prefills=4)
    chats = make_requests(4, prompt_len=8, max_tokens=30, prefix="chat")
    for r in chats:
        sched.add_request(r)
    step(sched)  # the chats prefill and start decoding
    for r in make_requests(6, prompt_len=400, max_tokens=2, prefix="doc"):
        sched.add_request(r)  # arrive while the chats decode
    run_until_done(sched)
    s = summarize(sched.finished, sched.step_records, sched.clock.now())
    assert s.zero_decode_step_share > 0.10
    found = diagnose(s, RuleSettings.of(s, {"max_num_batched_tokens": 64,
                                            "long_prefill_token_threshold": 0,
                                            "budget_order": "prefill_first"}))
    assert found[0].rule == "chunk_cap_eats_budget"
    assert "long_prefill_token_threshold = 0" in found[0].action


def test_open_loop_overload_grows_the_queue():
    sched = make_scheduler(max_num_seqs=4, max_model_len=256, num_gpu_blocks=128)
    reqs = make_requests(60, prompt_len=8, max_tokens=20)
    for i, r in enumerate(reqs):
        r.arrival_time = i * 0.01  # 100 req/s against ~20 req/s of service
    pending = list(reqs)
    runner = FakeRunner()
    while pending or sched.has_unfinished():
        while pending and pending[0].arrival_time <= sched.clock.now() + 1e-9:
            sched.add_request(pending.pop(0))
        step(sched, runner)
    s = summarize(sched.finished, sched.step_records, sched.clock.now())
    assert s.waiting_growth > 0 and s.waiting_monotonic_rise >= 10
    assert s.queue_time_p99_s > s.queue_time_p50_s > 0
    rules = rules_on(s, {"max_num_seqs": 4})
    assert {"queue_growing", "running_below_offered"} <= rules
    ts = timeseries(sched.step_records, bins=10)
    assert len(ts.t) == 10 and max(ts.waiting) > 0
    assert sum(ts.decode_tokens) + sum(ts.prefill_tokens) == \
        s.decode_tokens_computed + s.prefill_tokens_computed


def test_summarize_by_class_on_a_real_run():
    sched = make_scheduler()
    chat = make_requests(3, prompt_len=8, max_tokens=4, prefix="c")
    docs = make_requests(2, prompt_len=64, max_tokens=8, prefix="d")
    for r in chat:
        r.request_class = "chat"
    for r in docs:
        r.request_class = "summary"
    for r in chat + docs:
        sched.add_request(r)
    run_until_done(sched)
    by = summarize_by_class(sched.finished, sched.step_records, sched.clock.now())
    assert by["chat"].output_tokens == 12 and by["summary"].output_tokens == 16
    assert by["chat"].requests_finished == 3


def test_simulated_replicas_summarise_from_sim_result():
    cfg = EngineConfig().replace(replicas=2, max_num_seqs=4, max_model_len=512)
    specs = [RequestSpec(index=i, arrival_s=i * 0.005, prompt_len=16, output_len=20,
                         max_tokens=20, request_class="chat") for i in range(40)]
    res = simulate(cfg, specs, ConstantCost(0.01), num_gpu_blocks=256)
    s = summarize(res.requests, res.steps, res.duration_s)
    assert RunSummary.from_json(json.loads(json.dumps(s.to_json()))) == s  # JSON round trip
    assert s.replicas == 2 and s.steps == len(res.all_steps)
    assert s.requests_finished == 40 and s.output_tokens == 800
    assert s.running_max == 8  # both replicas full at once, summed
    assert s.waiting_max > 0 and s.waiting_growth > 0
    rules = rules_on(s, {"scheduler": {"max_num_seqs": 4}, "replicas": 2})
    assert "running_below_offered" in rules
