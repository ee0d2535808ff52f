"""The discrete-event loop: closed and open loops, replicas and routers, batch windows."""

from stepserve.config.settings import EngineConfig
from stepserve.sim.calibrated import CalibratedCost
from stepserve.sim.cost import ConstantCost
from stepserve.sim.loop import simulate
from stepserve.workload.spec import RequestSpec


def specs(n, prompt=8, out=5, gap=0.0):
    return [RequestSpec(i, i * gap, prompt, out, out) for i in range(n)]


def cfg(**kw):
    return EngineConfig().replace(max_model_len=256, **kw)


def test_closed_loop_keeps_concurrency_in_flight_and_ends_everything():
    sim = simulate(cfg(max_num_seqs=8), specs(40), ConstantCost(0.01), 512,
                   closed_loop_concurrency=4)
    assert len(sim.requests) == 40
    assert all(len(r.output_token_ids) == 5 for r in sim.requests)
    assert max(s.num_running for s in sim.all_steps) == 4
    # each request ends the step its 5th token is sampled: 4 in flight -> 10 waves x 5 steps
    assert abs(sim.duration_s - 10 * 5 * 0.01) < 1e-9


def test_open_loop_arrivals_respect_their_times():
    sim = simulate(cfg(), specs(5, gap=1.0), ConstantCost(0.01), 512)
    assert [r.arrival_time for r in sim.requests] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert all(r.first_scheduled_time == r.arrival_time for r in sim.requests)


def test_more_replicas_finish_a_burst_sooner():
    load = specs(64, prompt=64, out=32)
    cost = CalibratedCost({"step": 0.005, "token": 0.0005})
    one = simulate(cfg(max_num_seqs=16), load, cost, 512)
    three = simulate(cfg(max_num_seqs=16, replicas=3), load, cost, 512)
    assert three.replicas == 3 and len(three.steps) == 3
    assert three.duration_s < one.duration_s / 2


def test_dynamic_batching_waits_for_its_window_or_a_full_batch():
    # 3 requests 0.01 s apart; batch size 8, window 0.05 s: one batch at t = 0.05
    sim = simulate(cfg(batching="dynamic", max_num_seqs=8, batch_window_s=0.05),
                   specs(3, gap=0.01), ConstantCost(0.01), 512)
    assert {r.first_scheduled_time for r in sim.requests} == {0.05}
    full = simulate(cfg(batching="dynamic", max_num_seqs=3, batch_window_s=10.0),
                    specs(3, gap=0.01), ConstantCost(0.01), 512)
    assert {r.first_scheduled_time for r in full.requests} == {0.02}


def test_static_batches_do_not_refill_slots():
    load = [RequestSpec(i, 0.0, 4, 2 if i % 2 else 20, 20) for i in range(8)]
    sim = simulate(cfg(batching="static", max_num_seqs=4), load, ConstantCost(0.01), 512)
    second_batch_start = min(r.first_scheduled_time for r in sim.requests[4:])
    first_batch_end = max(r.finish_time for r in sim.requests[:4])
    assert second_batch_start >= first_batch_end
    cont = simulate(cfg(max_num_seqs=4), load, ConstantCost(0.01), 512)
    assert cont.duration_s < sim.duration_s
