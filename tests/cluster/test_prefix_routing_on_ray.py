"""prefix_affinity on a real local Ray cluster, 2 tiny-model replicas behind the ingress:

* a prompt whose prefix a replica holds goes back to it, unless that replica is busy;
* on one load of prompts that share a few system prompts, sent one at a time, the
  replicas' own prefix-cache counters (the ingress's merged /metrics) show a higher hit
  rate under prefix_affinity than under round_robin, which spreads each system prompt
  over both replicas.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("fastapi")

sys.path.insert(0, str(Path(__file__).parent))

import httpx  # noqa: E402
from ray_harness import RunningIngress, complete, delta, ingress, settled, stream_events  # noqa: E402

from stepserve.metrics.prometheus import parse_prometheus  # noqa: E402

pytestmark = pytest.mark.slow

AFFINITY = "router: prefix_affinity\npools:\n  affinity: {replicas: 2}\n"


def test_prefix_affinity_router_keeps_a_prompt_on_its_replica(ray_local, tmp_path):
    path = tmp_path / "pools.yaml"  # a pool of its own: the module's ingresses stay up
    path.write_text(AFFINITY)
    system = list(range(100, 164))  # four full blocks of 16 tokens
    with ingress(str(path)) as ing:
        events: list[str] = []
        started = threading.Event()
        long_one = threading.Thread(target=stream_events, args=(ing, 900, events, started))
        long_one.start()
        assert started.wait(60)
        (busy,) = [e for e, r in ing.replicas().items() if r["running"] + r["waiting"] > 0]
        assert busy == 0  # all idle, so the lower index: a tie would go there again
        before = ing.admitted()
        complete(ing, prompt=system + [7], max_tokens=2)  # away from the busy replica
        assert delta(before, ing.admitted()) == {0: 0, 1: 1}
        long_one.join(120)
        ing.wait_replicas(2)
        deadline = time.monotonic() + 60  # a replica that never reports idle fails here
        while any(r["running"] + r["waiting"] for r in ing.replicas().values()):
            assert time.monotonic() < deadline, ing.replicas()
            time.sleep(0.05)  # until both report idle (reports come every 0.5 s)
        before = ing.admitted()
        for own in (8, 9, 10):  # idle replicas alike: only the prefix says where
            complete(ing, prompt=system + [own], max_tokens=2)
            settled(outstanding=0)
        # (where a prompt of its own goes is load's call: the replicas' reported KV usage
        # lags by up to a report period, so either is right)
        assert delta(before, ing.admitted()) == {0: 0, 1: 3}


def cache_counters(ing: RunningIngress) -> tuple[float, float]:
    """(prompt tokens looked up, tokens found cached), summed over the replicas."""
    samples = parse_prometheus(httpx.get(ing.url + "/metrics", timeout=30).text)

    def total(name: str) -> float:
        return sum(v for (n, _), v in samples.items() if n == name)

    return (total("stepserve:prefix_cache_queries_total"),
            total("stepserve:prefix_cache_hits_total"))


def shared_prompt_load(seed: int = 3) -> list[list[int]]:
    """Three system prompts of four full blocks each, four requests apiece, each with a
    token of its own, in a shuffled order."""
    systems = [list(range(200 + 100 * k, 264 + 100 * k)) for k in range(3)]
    load = [systems[k] + [20 + i] for k in range(3) for i in range(4)]
    random.Random(seed).shuffle(load)
    return load


def hit_rate(ing: RunningIngress) -> float:
    queries, hits = cache_counters(ing)
    for prompt in shared_prompt_load():
        complete(ing, prompt=prompt, max_tokens=2)
        settled(outstanding=0)
    after_queries, after_hits = cache_counters(ing)
    assert after_queries - queries == 12 * 65  # every prompt token looked up once
    return (after_hits - hits) / (after_queries - queries)


def test_prefix_affinity_hits_more_often_than_round_robin(ray_local, tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text(AFFINITY)
    with ingress(str(path)) as ing:
        affinity = hit_rate(ing)
    with ingress(replicas=2, router="round_robin") as ing:
        round_robin = hit_rate(ing)
    print(f"prefix-cache hit rate: prefix_affinity {affinity:.1%}, "
          f"round_robin {round_robin:.1%}")  # shown with -s
    # prefix_affinity: only each system prompt's first request misses (9 of 12 hit);
    # round_robin sends each to both replicas, and each replica's first one misses
    assert affinity >= 9 * 64 / (12 * 65) - 1e-9, (affinity, round_robin)
    assert affinity > round_robin, (affinity, round_robin)
