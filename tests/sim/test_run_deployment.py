"""run_scenario with a pools file: each run's deployment is built once (its KV pools
checked before the first run starts) and is the one that run simulates and records."""

from __future__ import annotations

import pytest

import stepserve.sim.run as sim_run
from stepserve.config.errors import UsageError
from stepserve.sim.scenarios import get_scenario
from stepserve.workload.overrides import WorkloadOverrides

POOLS = {"pools": {"a": {"replicas": 1}, "b": {"replicas": 2}},
         "routing": {"default": "a", "rules": [{"prompt_tokens_over": 100, "pool": "b"}]}}


def test_each_run_builds_its_deployment_once_and_simulates_it(monkeypatch):
    built, simulated = [], []
    real_build, real_simulate = sim_run.deployment_from, sim_run.simulate

    def build(pools, config):
        built.append(real_build(pools, config))
        return built[-1]

    def simulate(*args, deployment=None, **kwargs):
        simulated.append(deployment)
        return real_simulate(*args, deployment=deployment, **kwargs)

    monkeypatch.setattr(sim_run, "deployment_from", build)
    monkeypatch.setattr(sim_run, "simulate", simulate)
    scenario = get_scenario("quickstart")
    result = sim_run.run_scenario(scenario, WorkloadOverrides(num_requests=20), pools=POOLS)
    assert len(result.runs) == len(scenario.runs) >= 2
    assert len(built) == len(result.runs)
    assert [id(d) for d in simulated] == [id(d) for d in built]
    assert all(r.deployment == d.describe() for r, d in zip(result.runs, built))


def test_a_pool_the_simulator_cannot_size_is_refused_before_any_run(monkeypatch):
    simulated = []
    monkeypatch.setattr(sim_run, "simulate", lambda *a, **k: simulated.append(1))
    pools = {"pools": {"a": {"replicas": 1}, "b": {"cache": {"swap_space": 4}}}}
    with pytest.raises(UsageError, match="swap_space = 4: sizes a real engine's memory"):
        sim_run.run_scenario(get_scenario("quickstart"), WorkloadOverrides(num_requests=5),
                             pools=pools)
    assert simulated == []
