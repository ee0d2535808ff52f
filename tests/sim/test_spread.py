"""A target's measured spread in the simulator (sim/spread.py): each step's time drawn
around the cost model's, seeded; the HTTP floor added to bench --sim's client times; a
profile without a spread as before; a garbage spread refused by the loader."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from stepserve.config.errors import UsageError
from stepserve.config.settings import EngineConfig
from stepserve.profile.probe_figures import ProbeFigures
from stepserve.profile.target_profile import build_profile
from stepserve.sim.calibrated import CalibratedCost
from stepserve.sim.cost import ConstantCost
from stepserve.sim.cost_options import CostModelOptions, cost_setup_for
from stepserve.sim.loop import simulate
from stepserve.sim.spread import HttpFloor, Sample, SpreadCost
from stepserve.workload.spec import RequestSpec

FIXTURE = (Path(__file__).parents[1] / "fixtures" / "target-profile"
           / "tiny-seqs3-budget32.json")
STEP_S = 0.01
FACTORS = tuple(0.5 + i / 100 for i in range(200))  # 0.50 .. 2.49, evenly


@pytest.fixture(scope="module")
def profile_json() -> dict:
    return build_profile(ProbeFigures.from_json(json.loads(FIXTURE.read_text()))).to_json()


def one_long_request(decode_runs: bool = True, cost=None, seed: int = 0) -> list[float]:
    """The gaps between one request's tokens: each one decode step alone."""
    spec = RequestSpec(index=0, arrival_s=0.0, prompt_len=8, output_len=3001, max_tokens=3001)
    cost = cost or SpreadCost(ConstantCost(STEP_S), FACTORS, seed)
    sim = simulate(EngineConfig().replace(max_model_len=4096), [spec], cost, 1024,
                   decode_runs=decode_runs)
    times = sim.requests[0].token_times
    return [b - a for a, b in zip(times, times[1:])]


def quantile(xs, q: float) -> float:
    return statistics.quantiles(xs, n=1000, method="inclusive")[int(q * 1000) - 1]


@pytest.mark.parametrize("decode_runs", [True, False])
def test_the_tail_is_what_the_spread_implies(decode_runs):
    """One request decoding alone: every gap is one step, the model's time times a draw,
    so the gaps' P99 over their P50 is the factors' P99 over their P50."""
    gaps = one_long_request(decode_runs)
    implied = quantile(FACTORS, 0.99) / quantile(FACTORS, 0.5)
    measured = quantile(gaps, 0.99) / quantile(gaps, 0.5)
    assert measured > 1.5  # a real tail
    assert measured == pytest.approx(implied, rel=0.05)
    assert statistics.median(gaps) == pytest.approx(STEP_S * quantile(FACTORS, 0.5), rel=0.05)


def test_the_seed_reproduces_and_another_differs():
    assert one_long_request(seed=3) == one_long_request(seed=3)
    assert one_long_request(seed=3) != one_long_request(seed=4)


def test_without_a_spread_the_times_are_todays(profile_json, tmp_path):
    """A profile whose spread is absent (or --no-spread) prices with the bare cost
    model, not a wrapper: the same gaps as its cost part as a cost file."""
    data = json.loads(json.dumps(profile_json))
    data["spread"] = None
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    bare = cost_setup_for(CostModelOptions(cost=str(path))).cost_model
    assert type(bare) is CalibratedCost
    off = cost_setup_for(CostModelOptions(cost=str(path), no_spread=True)).cost_model
    cost_part = CalibratedCost.from_json(data["cost"])
    assert one_long_request(cost=bare) == one_long_request(cost=cost_part) \
        == one_long_request(cost=off)
    gaps = one_long_request(cost=cost_part)
    assert max(gaps) == pytest.approx(min(gaps), rel=0.2)  # deterministic: no tail


def test_the_recorded_spread_gives_the_fixture_run_a_tail(profile_json, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile_json))
    cost = cost_setup_for(CostModelOptions(cost=str(path))).cost_model
    assert isinstance(cost, SpreadCost)
    gaps = one_long_request(cost=cost)
    samples = profile_json["spread"]["step_gap"]["samples"]
    implied = quantile(samples, 0.99) / quantile(samples, 0.5)
    assert quantile(gaps, 0.99) / quantile(gaps, 0.5) == pytest.approx(implied, rel=0.25)


@pytest.mark.parametrize("bad, said", [
    (-1.0, "spread.step_gap.samples[0] = -1"),
    (float("nan"), "spread.step_gap.samples[0] = nan"),
    (1e9, "spread.step_gap.samples[0] = 1000000000"),
    ("x", "spread.step_gap.samples[0] = 'x'"),
])
def test_a_garbage_spread_is_refused_by_the_loader(profile_json, tmp_path, bad, said):
    data = json.loads(json.dumps(profile_json))
    data["spread"]["step_gap"]["samples"][0] = bad
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=r"--cost .*: " + said.replace("[", r"\[")
                       .replace("]", r"\]") + r": must be a finite number in \(0, 100\]"):
        cost_setup_for(CostModelOptions(cost=str(path), no_spread=True))  # checked anyway


def test_a_garbage_http_overhead_is_refused(profile_json, tmp_path):
    data = json.loads(json.dumps(profile_json))
    data["spread"]["http_overhead_s"] = -0.5
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=r"spread.http_overhead_s = -0.5"):
        cost_setup_for(CostModelOptions(cost=str(path)))


def test_the_http_floor_is_its_overhead_plus_the_floors_jitter():
    floor = HttpFloor(0.002, Sample((0.5, 1.0, 1.0, 4.0), 0.004))
    draws = floor.draws(4000, seed=1)
    assert draws == floor.draws(4000, seed=1)
    # each draw is overhead + median x (factor - 1), never negative
    assert set(round(d, 9) for d in draws) == {0.0, 0.002, 0.014}
    assert HttpFloor(0.002, Sample((), 0.0)).draws(3, 0) == [0.002] * 3


def test_bench_sims_client_times_carry_each_requests_http_path():
    """run_sim with a path time per request: the client sees every token and the end
    that much later, and the send where it was; without one, the server's times."""
    from stepserve.bench.inprocess import run_sim
    from stepserve.bench.loadgen import LoadPlan

    specs = [RequestSpec(index=i, arrival_s=0.01 * i, prompt_len=16, output_len=5,
                         max_tokens=5) for i in range(4)]
    config = EngineConfig().replace(max_model_len=256)
    plain, _, _ = run_sim(LoadPlan(specs), config, ConstantCost(STEP_S), 64)
    path = HttpFloor(0.002, Sample((0.5, 1.0, 3.0), 0.004)).draws(len(specs), seed=5)
    late, _, _ = run_sim(LoadPlan(specs), config, ConstantCost(STEP_S), 64, path)
    for a, b, d in zip(plain, late, path):
        assert b.send_s == a.send_s
        assert b.chunk_times_s == pytest.approx([t + d for t in a.chunk_times_s])
        assert b.end_s == pytest.approx(a.end_s + d)
