"""Routers and pools as plain Python: what each router picks, which pool a rule sends a
request to, the pools file and its errors."""

from __future__ import annotations

import collections

import pytest

from stepserve.config.settings import ConfigError, EngineConfig
from stepserve.routing.pools import Deployment, PoolRouter, deployment_from
from stepserve.routing.routers import (
    LeastOutstanding,
    ReplicaView,
    RoundRobin,
    RouteRequest,
    make_router,
)

CHAT = RouteRequest(prompt_tokens=300, max_tokens=200)


def views(*loads: int, pool: str = "default") -> list[ReplicaView]:
    return [ReplicaView(i, pool, waiting=n) for i, n in enumerate(loads)]


def test_round_robin_takes_turns():
    rr = RoundRobin()
    assert [rr.pick(views(0, 0, 0), CHAT) for _ in range(4)] == [0, 1, 2, 0]


def test_least_outstanding_of_two_is_the_less_loaded():
    lo = LeastOutstanding()
    assert lo.pick(views(3, 1), CHAT) == 1
    assert lo.pick(views(1, 1), CHAT) == 0  # ties: the lower index


def test_power_of_two_choices_never_picks_the_busiest_and_balances():
    lo = LeastOutstanding(seed=1)
    loads = [0] * 8
    for _ in range(800):
        i = lo.pick(views(*loads), CHAT)
        assert loads[i] < max(loads) or loads.count(max(loads)) > 1  # never the sole busiest
        loads[i] += 1
    assert max(loads) - min(loads) <= 3  # near-even without scanning all eight


def test_unknown_router_is_refused():
    with pytest.raises(ValueError, match="round_robin, least_outstanding"):
        make_router("random")


POOLS = {
    "scheduler": {"max_num_batched_tokens": 2048},
    "router": "least_outstanding",
    "pools": {"online": {"replicas": 2, "scheduler": {"max_num_seqs": 16}},
              "offline": {"replicas": 1, "scheduler": {"max_num_seqs": 128}}},
    "routing": {"default": "online", "rules": [
        {"prompt_tokens_over": 4096, "pool": "offline"},
        {"max_tokens_over": 1200, "pool": "offline"},
        {"priority_at_least": 1, "pool": "offline"},
        {"tenant": ["nightly"], "pool": "offline"},
        {"header": {"X-Pool": "offline"}, "pool": "offline"}]},
}


def test_a_pools_file_builds_pools_with_their_own_configs():
    d = deployment_from(POOLS, EngineConfig())
    assert [(p.name, p.replicas) for p in d.pools] == [("online", 2), ("offline", 1)]
    assert [p.config.scheduler.max_num_seqs for p in d.pools] == [16, 128]
    assert all(p.config.scheduler.max_num_batched_tokens == 2048 for p in d.pools)
    assert d.num_replicas == 3 and d.router == "least_outstanding"
    assert [p.name for p in d.replica_pools()] == ["online", "online", "offline"]


@pytest.mark.parametrize("request_,pool", [
    (CHAT, "online"),
    (RouteRequest(8000, 100), "offline"),
    (RouteRequest(300, 2000), "offline"),
    (RouteRequest(300, 100, priority=1), "offline"),
    (RouteRequest(300, 100, priority=0), "online"),
    (RouteRequest(300, 100, tenant="nightly"), "offline"),
    (RouteRequest(300, 100, headers={"x-pool": "offline"}), "offline"),
])
def test_rules_send_a_request_to_its_pool(request_, pool):
    d = deployment_from(POOLS, EngineConfig())
    replicas = [ReplicaView(i, p.name) for i, p in enumerate(d.replica_pools())]
    picked = PoolRouter(d).pick(replicas, request_)
    assert replicas[picked].pool == pool


def test_the_pool_router_balances_within_a_pool():
    d = deployment_from(POOLS, EngineConfig())
    router = PoolRouter(d)
    loads = collections.Counter()
    for _ in range(100):
        replicas = [ReplicaView(i, p.name, waiting=loads[i])
                    for i, p in enumerate(d.replica_pools())]
        loads[router.pick(replicas, CHAT)] += 1
    assert loads[0] == loads[1] == 50 and loads[2] == 0


def test_without_pools_it_is_replicas_alike():
    d = deployment_from({"replicas": 3, "scheduler": {"max_num_seqs": 40}}, EngineConfig())
    assert d == Deployment.single(EngineConfig().replace(replicas=3, max_num_seqs=40))


@pytest.mark.parametrize("data,words", [
    ({"pools": {"a": {"replicas": 0}}}, "pools.a.replicas"),
    ({"pools": {"a": {"scheduler": {"max_num_seqs": 0}}}}, "pools.a"),
    ({"pools": {"a": {}}, "routing": {"default": "b"}}, "routing.default"),
    ({"pools": {"a": {}}, "routing": {"rules": [{"pool": "zzz", "tenant": "x"}]}}, "pool"),
    ({"pools": {"a": {}}, "routing": {"rules": [{"pool": "a", "colour": "red"}]}},
     "conditions"),
    ({"pools": {"a": {}}, "routing": {"rules": [{"pool": "a"}]}}, "conditions"),
    ({"routing": {"default": "a"}}, "need `pools`"),
    ({"pools": []}, "map pool names"),
])
def test_bad_pools_files_are_refused_naming_the_key(data, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.").replace("`", ".")):
        deployment_from(data, EngineConfig())
