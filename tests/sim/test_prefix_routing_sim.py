"""prefix_affinity in the simulator: replicas whose KV cannot hold every system prompt
hit their prefix cache far more often when each prompt keeps to a replica than when
requests go round, and every request still ends once."""

from __future__ import annotations

from stepserve.config.settings import EngineConfig
from stepserve.sim.cost import ConstantCost
from stepserve.sim.loop import simulate
from stepserve.workload.loader import workload_from_dict

WORKLOAD = {
    "num_requests": 240, "seed": 3, "arrival": {"poisson": {"rate": 40}},
    "classes": [{"name": "chat", "prompt": {"uniform": [16, 48]}, "output": {"uniform": [4, 12]},
                 "shared_prefixes": 12, "prefix_len": 256}],
}


def hit_rate(router: str) -> float:
    specs = workload_from_dict(WORKLOAD).generate()
    config = EngineConfig().replace(replicas=4, router=router, max_num_seqs=8,
                                    max_num_batched_tokens=512, max_model_len=512)
    # 64 blocks of 16 tokens: room for about three of the twelve 16-block prompts
    sim = simulate(config, specs, ConstantCost(0.01), num_gpu_blocks=64)
    assert len(sim.requests) == len(specs)
    assert all(r.is_finished for r in sim.requests)
    return sum(r.num_cached_tokens for r in sim.requests) / sum(s.prompt_len for s in specs)


def test_prefix_affinity_hits_the_cache_more_than_routers_blind_to_the_prompt():
    rates = {name: hit_rate(name)
             for name in ("prefix_affinity", "least_outstanding", "round_robin")}
    assert rates["prefix_affinity"] > 0.6
    assert rates["prefix_affinity"] > rates["round_robin"] + 0.2
    assert rates["prefix_affinity"] > rates["least_outstanding"] + 0.2
