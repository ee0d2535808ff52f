"""Property tests: invariants of the scheduler over random workloads and configs."""

from factories import FakeRunner, make_scheduler
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepserve.core.kv_cache import blocks_for
from stepserve.core.request import Request, RequestStatus, SamplingParams

MAX_LEN = 64


@st.composite
def configs(draw):
    budget = draw(st.integers(8, 96))
    partial = draw(st.integers(1, 3))
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    return dict(
        batching=draw(st.sampled_from(["continuous", "continuous", "static", "dynamic"])),
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=budget,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=draw(st.integers(0, budget)),
        max_num_partial_prefills=partial,
        max_long_partial_prefills=draw(st.integers(1, partial)),
        budget_order=draw(st.sampled_from(["decode_first", "prefill_first"])),
        policy=draw(st.sampled_from(["fcfs", "priority", "srpt", "fair"])),
        aging_after_s=draw(st.sampled_from([0.0, 0.05])),
        preemption_mode=draw(st.sampled_from(["recompute", "swap", "none"])),
        block_size=block_size,
        num_cpu_blocks=draw(st.integers(0, 40)),
        max_waiting=draw(st.integers(0, 6)),
        max_queue_time_s=draw(st.sampled_from([0.0, 0.2])),
        num_gpu_blocks=blocks_for(MAX_LEN, block_size) + draw(st.integers(0, 24)),
        max_model_len=MAX_LEN,
    )


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 14))
    reqs = []
    t = 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.01, 0.05]))
        prompt = draw(st.integers(1, 40))
        max_tokens = draw(st.integers(1, 24))
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                priority=draw(st.integers(0, 3)),
                                tenant=draw(st.sampled_from(["a", "b"])))
        reqs.append(Request(f"q{i}", [5] * prompt, params, arrival_time=t,
                            eos_token_id=draw(st.sampled_from([None, 7]))))
    return reqs


def drive(settings_: dict, reqs: list[Request]):
    settings_ = dict(settings_)
    blocks = settings_.pop("num_gpu_blocks")
    sched = make_scheduler(num_gpu_blocks=blocks, **settings_)
    runner = FakeRunner(step_s=0.01)
    pending = sorted(reqs, key=lambda r: r.arrival_time)
    sc = sched.config.scheduler
    steps = 0
    while pending or sched.has_unfinished():
        while pending and pending[0].arrival_time <= sched.clock.now():
            sched.add_request(pending.pop(0))
        if not sched.has_unfinished():
            sched.clock.advance_to(pending[0].arrival_time)
            continue
        before = {r.request_id: r.num_computed_tokens
                  for r in sched.running + sched.waiting + sched.swapped}
        waited = {r.request_id for r in sched.waiting}
        out = sched.schedule()
        # budget and batch caps
        assert out.total_num_scheduled_tokens <= sc.max_num_batched_tokens
        assert len(out.requests) <= sc.max_num_seqs
        assert len(sched.running) <= sc.max_num_seqs
        assert len(set(map(id, out.requests))) == len(out.requests)
        for r, n in zip(out.requests, out.num_scheduled_tokens):
            assert n >= 1 and r.num_computed_tokens + n <= r.num_tokens
        # victims: FCFS picks the most recently admitted; swap keeps progress (for a request
        # admitted in this very step, the prefix its admission found in the cache)
        for v in out.preempted:
            if sc.policy == "fcfs":
                assert all(v.admitted_seq > r.admitted_seq for r in sched.running)
            if v.status is RequestStatus.SWAPPED:
                kept = v.prefix_hit_tokens if v.request_id in waited else before[v.request_id]
                assert v.num_computed_tokens == kept
            else:
                assert v.status is RequestStatus.PREEMPTED and v.num_computed_tokens == 0
        if sc.preemption_mode == "none":
            assert not out.preempted
        sched.kv.check_integrity()
        if out.is_empty:
            if not sched.has_unfinished():
                continue  # everything left timed out in this very call
            wake = sched.next_wakeup_time()
            nxt = min([t for t in (wake, pending[0].arrival_time if pending else None)
                       if t is not None], default=None)
            assert nxt is not None, "idle with work but nothing will wake it"
            sched.clock.advance_to(max(nxt, sched.clock.now() + 1e-6))
            continue
        result = runner.execute(out)
        sched.clock.advance(result.elapsed_s)
        sched.update_from_output(out, result)
        steps += 1
        assert steps < 5000, "no progress"
    return sched


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), workloads())
def test_invariants_hold_and_every_request_ends_exactly_once(cfg, reqs):
    sched = drive(cfg, reqs)
    ended = sched.finished
    assert sorted(r.request_id for r in ended) == sorted(r.request_id for r in reqs)
    for r in reqs:
        assert r.is_finished and r.finish_reason is not None and r.finish_time is not None
        if r.status in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH):
            assert 1 <= len(r.output_token_ids) <= r.max_tokens
            assert len(r.token_times) == len(r.output_token_ids)
    assert sched.kv.all_free
    sched.kv.check_integrity()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.01, 0.03])),
                min_size=2, max_size=30),
       st.integers(1, 3))
def test_aging_bounds_the_wait_of_low_priority(arrivals, max_seqs):
    aging = 0.05
    reqs, t = [], 0.0
    for i, (prio, gap) in enumerate(arrivals):
        t += gap
        reqs.append(Request(f"p{i}", [5] * 4,
                            SamplingParams(max_tokens=6, temperature=0.0, priority=prio),
                            arrival_time=t))
    cfg = dict(policy="priority", aging_after_s=aging, max_num_seqs=max_seqs,
               max_num_partial_prefills=max_seqs, max_long_partial_prefills=max_seqs,
               num_gpu_blocks=256, max_model_len=MAX_LEN, block_size=4)
    drive(cfg, reqs)
    best = min(r.priority for r in reqs)
    for low in reqs:
        bound = low.arrival_time + (low.priority - best) * aging
        for other in reqs:
            if other.arrival_time > bound + 1e-9:
                assert other.first_scheduled_time >= low.first_scheduled_time
