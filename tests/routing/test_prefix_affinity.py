"""prefix_affinity: a request goes where its prompt's prefix was sent, unless load says
otherwise; every knob changes a choice; the index stays bounded; the names are the KV
manager's; the pools file takes the router and its knobs."""

from __future__ import annotations

import pickle

import pytest

from stepserve.config.settings import ConfigError, EngineConfig
from stepserve.core.prefix_hash import namer
from stepserve.core.request import Request, SamplingParams
from stepserve.routing.pools import PoolRouter, deployment_from
from stepserve.routing.routers import (
    PrefixAffinity,
    PrefixAffinityOptions,
    ReplicaView,
    RouteRequest,
    make_router,
)

BS = 16


def prompt(prefix: int, shared_blocks: int, own_blocks: int = 1, own: int = 0) -> list[int]:
    """`shared_blocks` full blocks of system prompt `prefix`, then the request's own."""
    return [10_000 + prefix] * (shared_blocks * BS) + [20_000 + own] * (own_blocks * BS)


def route(ids: list[int], salt: str | None = None) -> RouteRequest:
    return RouteRequest(len(ids), 10, prompt_token_ids=ids, cache_salt=salt)


def views(*loads: int, kv: tuple[float, ...] = ()) -> list[ReplicaView]:
    return [ReplicaView(i, waiting=n, kv_usage=kv[i] if kv else 0.0)
            for i, n in enumerate(loads)]


def router(**knobs) -> PrefixAffinity:
    return PrefixAffinity(block_size=BS, options=PrefixAffinityOptions(**knobs))


def warm(r: PrefixAffinity, replica: int, ids: list[int], n: int = 2) -> None:
    """Send `ids` to `replica` by making it the only unloaded one."""
    loads = [100] * n
    loads[replica] = 0
    assert r.pick(views(*loads), route(ids)) == replica


def test_a_prefix_follows_the_replica_it_was_sent_to():
    r = router()
    warm(r, 1, prompt(0, 4, own=1), n=3)
    warm(r, 2, prompt(1, 4, own=2), n=3)
    assert r.pick(views(0, 0, 0), route(prompt(0, 4, own=3))) == 1
    assert r.pick(views(0, 0, 0), route(prompt(1, 4, own=4))) == 2
    assert r.pick(views(0, 0, 0), route(prompt(7, 4))) == 0  # unknown: by load, then index


def test_round_robin_and_least_outstanding_ignore_the_prefix():
    for name in ("round_robin", "least_outstanding"):
        r = make_router(name)
        picks = {r.pick(views(0, 0), route(prompt(0, 4, own=i))) for i in range(4)}
        assert name == "least_outstanding" or picks == {0, 1}


def test_prefix_weight_zero_routes_by_load_alone():
    ids = prompt(0, 4, own=9)
    for weight, expected in ((3.0, 0), (0.0, 1)):
        r = router(prefix_weight=weight)
        warm(r, 0, prompt(0, 4))
        assert r.pick(views(1, 0), route(ids)) == expected


def test_queue_weight_trades_affinity_against_queue_length():
    ids = prompt(0, 2, own_blocks=2, own=9)  # half its blocks match: 0.5 * 3 = 1.5
    for weight, expected in ((2.0, 0), (4.0, 1)):  # 10 more of a threshold of 16
        r = router(queue_weight=weight)
        warm(r, 0, prompt(0, 2))
        assert r.pick(views(10, 0), route(ids)) == expected


def test_kv_weight_trades_affinity_against_kv_usage():
    ids = prompt(0, 4, own=9)
    for weight, expected in ((2.0, 0), (4.0, 1)):
        r = router(kv_weight=weight)
        warm(r, 0, prompt(0, 4))
        assert r.pick(views(0, 0, kv=(0.9, 0.0)), route(ids)) == expected


def test_a_replica_too_far_ahead_of_the_least_loaded_is_passed_over():
    ids = prompt(0, 8, own=9)
    for threshold, expected in ((16, 0), (4, 1)):
        r = router(imbalance_threshold=threshold)
        warm(r, 0, prompt(0, 8))
        assert r.pick(views(5, 0), route(ids)) == expected


def test_index_blocks_bounds_what_a_replica_remembers():
    a, b = prompt(0, 3), prompt(1, 3)
    for capacity, expected in ((64, 0), (4, 1)):
        r = router(index_blocks=capacity)
        warm(r, 0, a)
        warm(r, 0, b)  # with room for 4 names, b's 4 push a's out
        assert all(len(lru) <= capacity for lru in r.index.values())
        assert r.pick(views(1, 0), route(prompt(0, 3, own=5))) == expected


def test_max_prefix_blocks_bounds_the_blocks_hashed_and_matched():
    ids = prompt(0, 2, own_blocks=6, own=9)  # 2 of 8 blocks shared: 0.25 * 3
    for most, expected in ((256, 1), (2, 0)):
        r = router(max_prefix_blocks=most)
        warm(r, 0, prompt(0, 2, own_blocks=6))
        assert len(r.prompt_hashes(route(ids))) == min(8, most)
        assert r.pick(views(8, 0), route(ids)) == expected


def test_block_names_are_the_kv_managers_and_the_salt_separates_them():
    ids = list(range(5 * BS + 3))
    for salt in (None, "tenant-a"):
        req = Request("r", ids, SamplingParams(max_tokens=1), 0.0, cache_salt=salt)
        assert router().prompt_hashes(route(ids, salt)) == namer().names(req, 5, BS)
    r = router()
    warm(r, 0, ids)
    assert r.pick(views(1, 0), route(ids, "tenant-b")) == 1  # no match across salts


def test_thousands_of_prefixes_keep_the_index_bounded():
    r = router(index_blocks=500)
    loads = [0, 0, 0, 0]
    for tenant in range(3000):
        i = r.pick(views(*loads), route(prompt(tenant, 3, own=tenant)))
        loads[i] += 1
        loads[(i + 1) % 4] = max(0, loads[(i + 1) % 4] - 1)
    assert len(r.index) <= 4
    assert all(len(lru) <= 500 for lru in r.index.values())
    assert sum(len(lru) for lru in r.index.values()) == 4 * 500  # full, and no more


def test_a_replica_that_leaves_is_forgotten():
    r = router()
    warm(r, 2, prompt(0, 2), n=3)
    r.pick(views(0, 0), route(prompt(1, 2)))
    assert set(r.index) <= {0, 1}


def test_a_route_crosses_a_process_boundary_without_its_prompt():
    sent = pickle.loads(pickle.dumps(route(prompt(0, 100), "s")))
    assert sent.prompt_token_ids == () and sent.prompt_tokens == 101 * BS
    assert sent.cache_salt == "s"


def test_the_pools_file_takes_the_router_and_its_knobs():
    d = deployment_from({"replicas": 2, "router": "prefix_affinity", "cache": {"block_size": 32},
                         "prefix_affinity": {"queue_weight": 1, "index_blocks": 100}},
                        EngineConfig())
    assert d.router == "prefix_affinity" and d.prefix_affinity.index_blocks == 100
    assert d.describe()["prefix_affinity"]["queue_weight"] == 1
    inner = PoolRouter(d)._routers["default"]
    assert isinstance(inner, PrefixAffinity) and inner.block_size == 32
    assert inner.options.queue_weight == 1


@pytest.mark.parametrize("data,message", [
    ({"router": "prefix_affinity", "prefix_affinity": {"weight": 1}},
     "unknown 'weight'; the knobs are prefix_weight, queue_weight"),
    ({"router": "prefix_affinity", "prefix_affinity": {"kv_weight": -1}},
     r"prefix_affinity.kv_weight = -1: must be a finite number in \[0, 1000\]"),
    ({"router": "prefix_affinity", "prefix_affinity": {"index_blocks": 0}},
     r"prefix_affinity.index_blocks = 0: must be an integer in \[1, 1048576\]"),
    ({"router": "prefix_affinity", "prefix_affinity": [1]},
     "prefix_affinity = \\[1\\]: must be a mapping"),
    ({"router": "round_robin", "prefix_affinity": {"kv_weight": 1}},
     "knobs of the prefix_affinity router, but router is round_robin"),
])
def test_bad_knobs_are_refused_by_name(data, message):
    with pytest.raises(ConfigError, match=message):
        deployment_from(data, EngineConfig())
