"""Separate pools in the simulator: an offline burst of long documents shares three
replicas with chat (before), or goes to its own pool (after, the same pools file a
server would take): chat's TTFT P99 falls, and the offline work still finishes."""

from __future__ import annotations

import random

from stepserve.config.settings import EngineConfig
from stepserve.metrics.percentiles import percentile
from stepserve.plan.model_specs import get_model_spec
from stepserve.routing.pools import deployment_from
from stepserve.sim.loop import simulate
from stepserve.sim.roofline import RooflineCost, get_hardware
from stepserve.workload.spec import RequestSpec

BASE = EngineConfig().replace(max_model_len=16384, max_num_seqs=64,
                              max_num_batched_tokens=8192)
AFTER = {"pools": {"online": {"replicas": 2},
                   "offline": {"replicas": 1, "scheduler": {"max_num_seqs": 32}}},
         "routing": {"default": "online",
                     "rules": [{"prompt_tokens_over": 2048, "pool": "offline"}]}}


def workload(seed: int = 0) -> list[RequestSpec]:
    """Chat at 8 req/s for 30 s; at t = 5 s, 60 summaries of 8k-token documents."""
    rng = random.Random(seed)
    specs, t = [], 0.0
    while t < 30.0:
        t += rng.expovariate(8.0)
        specs.append(("chat", t, rng.randint(200, 400), rng.randint(50, 150)))
    specs += [("offline", 5.0 + 0.01 * i, 8000, 300) for i in range(60)]
    specs.sort(key=lambda s: s[1])
    return [RequestSpec(i, t, p, o, o, request_class=c) for i, (c, t, p, o) in
            enumerate(specs)]


def ttft_p99(sim, cls: str) -> float:
    return percentile([r.ttft for r in sim.requests if r.request_class == cls], 99)


def test_a_separate_offline_pool_protects_chat_ttft():
    cost = RooflineCost(get_hardware("h100"), get_model_spec("llama-3-8b"))
    specs = workload()
    before = simulate(BASE.replace(replicas=3), specs, cost, 20000)
    after = simulate(BASE, specs, cost, 20000, deployment=deployment_from(AFTER, BASE))
    chat_before, chat_after = ttft_p99(before, "chat"), ttft_p99(after, "chat")
    assert chat_after < chat_before / 3, (chat_before, chat_after)
    # every request still finished, the offline ones all on the offline replica
    for sim in (before, after):
        assert all(r.finish_reason is not None and r.finish_reason.value == "length"
                   for r in sim.requests)
    offline_steps = after.steps[2]
    assert sum(s.num_prefill_tokens for s in offline_steps) >= 60 * 8000
