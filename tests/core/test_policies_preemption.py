"""Policies order the queue and choose victims; preemption modes differ as specified."""

from factories import FakeRunner, make_requests, make_scheduler, run_until_done, step

from stepserve.core.request import RequestStatus


def admitted_order(sched):
    return [r.request_id for r in sorted(sched.finished, key=lambda r: r.first_scheduled_time)]


def test_fcfs_admits_in_arrival_order():
    sched = make_scheduler(max_num_seqs=1)
    for i, r in enumerate(make_requests(4, max_tokens=2)):
        r.arrival_time = i * 0.001
        r.sampling_params.priority = 3 - i
        sched.add_request(r)
    run_until_done(sched)
    assert admitted_order(sched) == ["r0", "r1", "r2", "r3"]


def test_priority_admits_lowest_value_first():
    sched = make_scheduler(max_num_seqs=1, policy="priority")
    for pr, r in zip((5, 1, 3), make_requests(3, max_tokens=2)):
        r.priority = pr
        sched.add_request(r)
    run_until_done(sched)
    assert admitted_order(sched) == ["r1", "r2", "r0"]


def test_aging_lets_an_old_low_priority_request_overtake_new_urgent_ones():
    """Aging bounds the wait: a priority-5 request is served no later than urgent
    (priority-0) requests that arrived 5 aging periods after it."""

    def run(aging):
        sched = make_scheduler(max_num_seqs=1, policy="priority", aging_after_s=aging)
        runner = FakeRunner(step_s=0.1)
        (low,) = make_requests(1, max_tokens=1, prefix="low")
        low.priority = 5
        sched.add_request(low)
        urgent = []
        for k in range(300):  # a steady stream of urgent requests, one per step
            (u,) = make_requests(1, max_tokens=2, prefix=f"u{k}-")
            u.arrival_time = sched.clock.now()
            sched.add_request(u)
            urgent.append(u)
            step(sched, runner)
            if low.is_finished:
                break
        return low, urgent

    low, _ = run(0.0)
    assert not low.is_finished  # without aging it starves
    low, urgent = run(1.0)
    assert low.is_finished
    later = [u for u in urgent if u.arrival_time > low.arrival_time + 5 * 1.0 + 1e-9]
    assert later, "the stream must outlast the aging bound"
    assert all(u.first_scheduled_time is None or u.first_scheduled_time > low.first_scheduled_time
               for u in later)


def test_srpt_admits_shortest_expected_output_first():
    sched = make_scheduler(max_num_seqs=1, policy="srpt")
    for mt, r in zip((50, 5, 20), make_requests(3)):
        r.max_tokens = mt
        r.sampling_params.max_tokens = mt
        sched.add_request(r)
    run_until_done(sched)
    assert admitted_order(sched) == ["r1", "r2", "r0"]


def test_fair_share_alternates_tenants_instead_of_serving_the_flood_first():
    sched = make_scheduler(max_num_seqs=1, policy="fair")
    for r in make_requests(6, max_tokens=4, prefix="a", tenant="A"):
        sched.add_request(r)
    for r in make_requests(2, max_tokens=4, prefix="b", tenant="B"):
        r.arrival_time = 0.5  # B arrives later than all of A
        sched.add_request(r)
    run_until_done(sched)
    order = admitted_order(sched)
    assert order.index("b0") < order.index("a2") and order.index("b1") < order.index("a3")


def tight(**kw):
    # 10 blocks of 4 tokens: three requests of 8 + 8 tokens cannot all finish together
    return make_scheduler(num_gpu_blocks=10, block_size=4, max_model_len=32, **kw)


def test_recompute_victim_is_most_recently_admitted_and_restarts_from_zero():
    sched = tight(preemption_mode="recompute")
    reqs = make_requests(3, prompt_len=8, max_tokens=8)
    for r in reqs:
        sched.add_request(r)
    seen = []
    while sched.has_unfinished():
        out = step(sched)
        for v in out.preempted:
            seen.append((v.request_id, v.admitted_seq,
                         max(r.admitted_seq for r in sched.running + [v])))
            assert v.num_computed_tokens == 0 and v.status is RequestStatus.PREEMPTED
            assert v.output_token_ids  # output so far is kept
    assert seen, "expected a preemption"
    assert all(seq == newest for _, seq, newest in seen)
    assert sum(r.num_recomputed_tokens for r in reqs) > 0
    assert all(len(r.output_token_ids) == 8 for r in reqs)
    assert sched.kv.all_free


def test_swap_keeps_progress_and_emits_block_copies():
    sched = tight(preemption_mode="swap", num_cpu_blocks=16)
    reqs = make_requests(3, prompt_len=8, max_tokens=8)
    for r in reqs:
        sched.add_request(r)
    swaps_out = swaps_in = 0
    while sched.has_unfinished():
        out = step(sched)
        for v in out.preempted:
            assert v.status is RequestStatus.SWAPPED and v.num_computed_tokens > 0
        swaps_out += len(out.swap_out)
        swaps_in += len(out.swap_in)
    assert swaps_out > 0 and swaps_out == swaps_in
    assert sum(r.num_recomputed_tokens for r in reqs) == 0
    assert sum(r.num_swapped_out_blocks for r in reqs) == swaps_out
    assert sched.kv.all_free


def test_swap_falls_back_to_recompute_when_the_cpu_pool_is_full():
    sched = tight(preemption_mode="swap", num_cpu_blocks=0)
    reqs = make_requests(3, prompt_len=8, max_tokens=8)
    for r in reqs:
        sched.add_request(r)
    run_until_done(sched)
    assert sched.num_preemptions_total > 0
    assert sum(r.num_recomputed_tokens for r in reqs) > 0


def test_preemption_mode_none_reserves_and_never_evicts():
    sched = tight(preemption_mode="none")
    reqs = make_requests(3, prompt_len=8, max_tokens=8)
    for r in reqs:
        sched.add_request(r)
    outs = run_until_done(sched)
    assert sched.num_preemptions_total == 0
    assert max(len(o.requests) for o in outs) == 2  # the third waits for room
    assert all(len(r.output_token_ids) == 8 for r in reqs)


def test_abort_frees_blocks_and_ends_once():
    sched = make_scheduler()
    a, b = make_requests(2, max_tokens=10)
    sched.add_request(a)
    sched.add_request(b)
    step(sched)
    assert sched.abort_request("r0")
    assert not sched.abort_request("r0")
    out = sched.schedule()
    assert out.finished_request_ids == ["r0"]
    assert [r.request_id for r in out.requests] == ["r1"]
    assert a.status is RequestStatus.FINISHED_ABORTED


def blocks4(**kw):
    # 4 blocks of 4 tokens, no watermark: two requests fill the device within a few steps
    return make_scheduler(num_gpu_blocks=4, block_size=4, max_model_len=16, **kw)


def test_a_victim_already_in_the_batch_gives_its_tokens_back():
    sched = blocks4(policy="priority")
    (low,) = make_requests(1, prompt_len=4, max_tokens=8, prefix="low", priority=5)
    sched.add_request(low)
    step(sched)  # low: 1 block
    (high,) = make_requests(1, prompt_len=8, max_tokens=8, prefix="high")
    sched.add_request(high)
    step(sched)  # low decodes into its 2nd block, high prefills 2: the device is full
    out = sched.schedule()
    # low (first in the walk) fits and is scheduled; high needs a block, and the policy's
    # victim is low: it leaves the batch and its token goes back to the budget.
    assert out.requests == [high]
    assert out.preempted == [low] and out.num_decode_tokens == 1
    assert out.num_scheduled_tokens == [1] and out.block_tables == [sched.kv.block_table("high0")]
    assert low.status is RequestStatus.PREEMPTED and sched.waiting[0] is low
    assert sched.running == [high]
    sched.kv.check_integrity()


def test_a_victim_ahead_of_the_walk_is_never_scheduled():
    sched = blocks4()  # fcfs: the victim is the most recently admitted
    (first,) = make_requests(1, prompt_len=8, max_tokens=8, prefix="first")
    (second,) = make_requests(1, prompt_len=7, max_tokens=8, prefix="second")
    sched.add_request(first)
    sched.add_request(second)
    step(sched)  # 2 blocks each: the device is full
    out = sched.schedule()
    # first needs a 3rd block; the victim is second, still ahead in the walk
    assert out.requests == [first]
    assert out.preempted == [second] and second.sched_step != out.step_index
    assert sched.running == [first] and sched.waiting == [second]
    sched.kv.check_integrity()
