"""The scheduling overhead every cost model adds (per scheduled sequence, per request
joining the batch), and the roofline's price of swapped KV blocks over the host link."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stepserve.core.output import SchedulerOutput
from stepserve.core.request import Request, SamplingParams
from stepserve.plan.model_specs import get_model_spec
from stepserve.sim.calibrated import CalibratedCost
from stepserve.sim.cost import ConstantCost, SchedulingOverhead, joining
from stepserve.sim.roofline import HARDWARE, RooflineCost, get_hardware

OVERHEAD = SchedulingOverhead(per_seq_s=1e-4, per_join_s=1e-3)


def _req(i: int, prompt: int, computed: int) -> Request:
    req = Request(f"r{i}", [1] * prompt, SamplingParams(max_tokens=64), 0.0)
    req.num_computed_tokens = computed
    if computed >= prompt:
        req.output_token_ids.append(1)
    return req


def step(decodes: int, fresh: int = 0) -> SchedulerOutput:
    """`decodes` decoding requests and `fresh` new ones prefilling 100 tokens."""
    reqs = [_req(i, 50, 50) for i in range(decodes)] + \
        [_req(1000 + i, 100, 0) for i in range(fresh)]
    return SchedulerOutput(0, reqs, [1] * decodes + [100] * fresh)


def test_a_request_joins_when_its_step_starts_its_sequence():
    assert joining([0, 50, 0, 7]) == 2
    out = step(decodes=3, fresh=2)
    cost = ConstantCost(0.024, OVERHEAD)
    assert cost.step_time(out) == pytest.approx(0.024 + 5 * 1e-4 + 2 * 1e-3)
    assert cost.step_time(step(decodes=10)) == pytest.approx(0.024 + 10 * 1e-4)
    assert cost.decode_step_time(10, 500) == cost.step_time(step(decodes=10))
    assert ConstantCost(0.024).step_time(out) == 0.024  # none by default


def test_a_full_batch_pays_more_per_step_than_a_drained_one():
    # the night report's engine: 10 live sequences 25 ms, 64 of them 30.4 ms
    cost = ConstantCost(0.024, OVERHEAD)
    assert cost.decode_step_time(10, 0) == pytest.approx(0.025)
    assert cost.decode_step_time(64, 0) == pytest.approx(0.0304)


def test_every_cost_model_names_its_scheduling_overhead():
    assert ConstantCost(0.024, OVERHEAD).describe() == (
        "constant 24 ms per step + scheduling overhead 100 us per scheduled sequence + "
        "1 ms per request joining the batch")
    hw = replace(get_hardware("h100"), seq_overhead_s=2e-5, join_overhead_s=3e-4)
    assert "4 ms/step overhead + 20 us/sequence + 300 us/join" in \
        RooflineCost(hw, get_model_spec("llama-3-8b")).describe()
    calibrated = CalibratedCost({"step": 0.01, "seq": 5e-5, "join": 2e-4})
    assert "scheduling overhead 50 us per sequence, 200 us per request joining the batch" \
        in calibrated.describe()
    with pytest.raises(ValueError, match="per_join_s = -1"):
        SchedulingOverhead(per_join_s=-1)


def test_roofline_adds_the_overhead_on_both_paths():
    spec = get_model_spec("llama-3-8b")
    plain = RooflineCost(get_hardware("h100"), spec)
    hw = replace(get_hardware("h100"), seq_overhead_s=2e-5, join_overhead_s=3e-4)
    loaded = RooflineCost(hw, spec)
    out = step(decodes=8, fresh=1)
    assert loaded.step_time(out) - plain.step_time(out) == pytest.approx(9 * 2e-5 + 3e-4)
    assert loaded.decode_step_time(8, 400) - plain.decode_step_time(8, 400) == \
        pytest.approx(8 * 2e-5)


def test_roofline_prices_swapped_blocks_over_the_host_link():
    spec = get_model_spec("qwen2.5-14b")  # 192 KiB a token: 3 MiB a 16-token block
    assert all(hw.host_link_bandwidth > 0 for hw in HARDWARE.values())
    cost = RooflineCost(get_hardware("h100"), spec)
    block = 16 * spec.kv_bytes_per_token
    assert cost.swap_time(100) == pytest.approx(100 * block / 50e9)
    out = step(decodes=4)
    swapping = step(decodes=4)
    swapping.swap_out = [(b, b) for b in range(30)]
    swapping.swap_in = [(b, b) for b in range(10)]
    assert cost.step_time(swapping) - cost.step_time(out) == pytest.approx(cost.swap_time(40))
    # swap vs recompute for a 2,000-token sequence on an H100: out and back in costs ~16 ms
    # of copies, recomputing it ~0.12 s of prefill
    blocks = 2000 // 16
    assert 2 * cost.swap_time(blocks) < 0.02 < 0.1 < cost.recompute_time(2000)
    assert "host link 50 GB/s" in cost.describe()
