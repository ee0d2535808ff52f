"""Decode runs (core/decode_run.py): the simulator's fast path must leave exactly what
stepping one step at a time leaves, and must actually be taken."""

from dataclasses import astuple, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepserve.config.settings import EngineConfig
from stepserve.core.clock import VirtualClock
from stepserve.core.decode_run import Sampler, decoding_batch, run_decodes
from stepserve.core.engine_core import EngineCore
from stepserve.core.request import Request, SamplingParams
from stepserve.plan.model_specs import get_model_spec
from stepserve.sim.calibrated import CalibratedCost
from stepserve.sim.cost import ConstantCost, SchedulingOverhead
from stepserve.sim.loop import SimRunner, simulate
from stepserve.sim.roofline import RooflineCost, get_hardware
from stepserve.workload.spec import RequestSpec

COSTS = {
    "constant": ConstantCost(0.02),
    "roofline": RooflineCost(get_hardware("h100"), get_model_spec("llama-3-8b")),
    "calibrated": CalibratedCost({"step": 0.006, "seq": 2e-4, "token": 6e-5, "token_hi": 1e-5,
                                  "kv_read": 2e-7, "attn": 1e-9, "swap": 5e-5,
                                  "join": 3e-4}, 16),
    # scheduling overhead: per sequence, and per join (the runner's count of who joined
    # must come out the same when decode runs skip its steps)
    "constant+overhead": ConstantCost(0.02, SchedulingOverhead(2e-5, 4e-4)),
    "roofline+overhead": RooflineCost(replace(get_hardware("h100"), seq_overhead_s=5e-5,
                                              join_overhead_s=4e-4),
                                      get_model_spec("llama-3-8b")),
}


def snapshot(sim):
    """Everything a simulation leaves behind that metrics or a reader could see."""
    requests = [(r.request_id, r.status, r.finish_reason, r.finish_message, r.stop_reason,
                 r.finish_time,
                 tuple(r.output_token_ids), tuple(r.token_times), r.num_computed_tokens,
                 r.first_scheduled_time, r.num_preemptions, r.reject_reason)
                for r in sim.requests]
    steps = [[astuple(s) for s in per] for per in sim.steps]
    return requests, steps, sim.duration_s


def both_ways(config, specs, cost, blocks, **kw):
    stepped = simulate(config, specs, cost, blocks, decode_runs=False, **kw)
    fast = simulate(config, specs, cost, blocks, **kw)
    return snapshot(stepped), snapshot(fast)


workloads = st.lists(
    st.tuples(st.floats(0.0, 0.2), st.integers(1, 120), st.integers(1, 60),
              st.integers(0, 20), st.integers(0, 2), st.sampled_from(["a", "b", "c"])),
    min_size=1, max_size=40)


def to_specs(rows):
    t, specs = 0.0, []
    for i, (gap, prompt, out, extra, prio, tenant) in enumerate(rows):
        t += gap
        specs.append(RequestSpec(i, t, prompt, out, out + extra, priority=prio, tenant=tenant))
    return specs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=workloads,
       cost=st.sampled_from(sorted(COSTS)),
       policy=st.sampled_from(["fcfs", "priority", "srpt", "fair"]),
       preemption=st.sampled_from(["recompute", "swap"]),
       order=st.sampled_from(["decode_first", "prefill_first"]),
       max_num_seqs=st.integers(1, 12),
       budget=st.sampled_from([16, 64, 512]),
       blocks=st.integers(26, 60),
       closed=st.sampled_from([None, 3]),
       replicas=st.sampled_from([1, 2]))
def test_a_simulation_is_the_same_with_and_without_decode_runs(
        rows, cost, policy, preemption, order, max_num_seqs, budget, blocks, closed, replicas):
    config = EngineConfig().replace(
        max_model_len=192, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
        long_prefill_token_threshold=min(budget, 48), policy=policy, aging_after_s=0.05,
        preemption_mode=preemption, num_cpu_blocks=40 if preemption == "swap" else 0,
        budget_order=order, block_size=8, replicas=replicas)
    stepped, fast = both_ways(config, to_specs(rows), COSTS[cost], blocks,
                              closed_loop_concurrency=closed)
    assert fast == stepped


def _loaded(gap):
    return to_specs([(gap * (i % 7), 200 + 37 * (i % 11), 20 + 13 * (i % 17), 5, 0, "a")
                     for i in range(200)])


LOADED = EngineConfig().replace(max_model_len=1024, max_num_seqs=48, block_size=16,
                                max_num_batched_tokens=2048)


@pytest.mark.parametrize("cost", sorted(COSTS))
def test_an_open_loop_is_the_same_and_mostly_runs(cost, monkeypatch):
    """200 arrivals, ~0.12 s apart: the same results, and most request-iterations are
    done by runs (the fast path is really taken)."""
    in_runs = []
    original = EngineCore.run_decodes

    def counting(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if result is not None:
            in_runs.extend(s.num_scheduled_seqs for s in result.records)
        return result

    monkeypatch.setattr(EngineCore, "run_decodes", counting)
    stepped, fast = both_ways(LOADED, _loaded(0.04), COSTS[cost], 700)
    assert fast == stepped
    total = sum(s[6] for per in fast[1] for s in per)
    assert sum(in_runs) > 0.6 * total


@pytest.mark.parametrize("cost", sorted(COSTS))
def test_a_pool_that_preempts_is_the_same(cost):
    stepped, fast = both_ways(LOADED, _loaded(0.011), COSTS[cost], 600)
    assert fast == stepped
    assert any(r[9] for r in fast[0]), "the pool was meant to preempt"


def test_a_cost_model_that_cannot_price_a_decode_step_is_stepped():
    class Opaque(ConstantCost):
        def decode_step_time(self, batch, computed):
            return None

    specs = to_specs([(0.0, 10, 30, 0, 0, "a")] * 4)
    config = EngineConfig().replace(max_model_len=128)
    sim = simulate(config, specs, Opaque(0.01), 64)
    assert len(sim.all_steps) == 30 and all(len(r.output_token_ids) == 30 for r in sim.requests)


# ---- the core function on a hand-made scheduler: stop ids, min_tokens, ignore_eos ----

def _engine(**params):
    config = EngineConfig().replace(max_model_len=128, block_size=4)
    clock = VirtualClock()
    runner = SimRunner(ConstantCost(0.01))
    core = EngineCore(config, runner, clock, 200)
    for i, (out_len, kw) in enumerate(params.items()):
        # distinct prompts: shared ones would queue behind each other's first block
        req = Request(str(i), [10 + i] + [5] * 5, SamplingParams(**kw), 0.0, eos_token_id=0)
        core.add_request(req)
        runner.register(req.request_id, int(out_len.split("_")[1]))
    return core, runner, clock


CASES = dict(  # name: output length at which the runner samples EOS -> sampling params
    r_9=dict(max_tokens=40),
    r_12=dict(max_tokens=40, min_tokens=20),  # EOS from 12 on, but no stop before 20
    r_5=dict(max_tokens=25, ignore_eos=True),  # EOS sampled and ignored: ends by length
    r_30=dict(max_tokens=14, stop_token_ids=[7]),
    r_40=dict(max_tokens=30, min_tokens=3, stop_token_ids=[1]),  # stops on the plain token
)


def _step_all(core, clock):
    while core.has_unfinished():
        pending = core.begin_step()
        clock.advance_to(clock.now() + pending.elapsed_s)
        core.complete_step(pending)


def test_stop_rules_min_tokens_and_ignore_eos_match_stepping():
    reference, _, clock = _engine(**CASES)
    _step_all(reference, clock)
    core, runner, clock = _engine(**CASES)
    pending = core.begin_step()  # the prefill
    clock.advance_to(clock.now() + pending.elapsed_s)
    core.complete_step(pending)
    assert decoding_batch(core.scheduler) is not None
    runs = 0
    while core.has_unfinished():
        run = core.run_decodes(clock.now(), float("inf"), runner.decode_step_time,
                               runner.sampler)
        if run is None:
            break
        runs += 1
        clock.advance_to(run.end_s)
    assert runs and not core.has_unfinished()
    ref = sorted(reference.scheduler.finished, key=lambda r: r.request_id)
    got = sorted(core.scheduler.finished, key=lambda r: r.request_id)
    assert [(r.finish_reason, r.output_token_ids, r.token_times, r.finish_time) for r in got] \
        == [(r.finish_reason, r.output_token_ids, r.token_times, r.finish_time) for r in ref]
    assert [len(r.output_token_ids) for r in got] == [9, 20, 25, 14, 3]
    assert core.scheduler.kv.all_free


def test_nothing_changes_when_no_step_fits_before_the_next_event():
    core, runner, clock = _engine(r_9=dict(max_tokens=40))
    core.step()
    before = (core.scheduler.step_index, list(core.scheduler.running[0].output_token_ids))
    sampler = Sampler(1, 0, runner.sampler.plain_steps)
    assert run_decodes(core.scheduler, 0.0, 0.0, runner.decode_step_time, sampler) is None
    assert (core.scheduler.step_index,
            list(core.scheduler.running[0].output_token_ids)) == before
