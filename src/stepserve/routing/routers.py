"""Routers: which replica of a pool gets a request.

* round_robin: in turn.
* least_outstanding: power of two choices: two replicas drawn at random, the one holding
  fewer requests (waiting + running) wins, ties to the lower index. Near-optimal
  balance without comparing every replica (Mitzenmacher), and with two replicas it is
  exactly "the less loaded one".
* prefix_affinity: where the prompt's prefix probably is, weighed with queue length and
  KV usage (prefix_affinity.py).
All are deterministic for a given seed, so a simulation repeats exactly.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from stepserve.config.settings import ROUTERS  # the names config.py validates
from stepserve.routing.prefix_affinity import PrefixAffinity, PrefixAffinityOptions
from stepserve.routing.view import ReplicaView, Router, RouteRequest

__all__ = ["Router", "RoundRobin", "LeastOutstanding", "PrefixAffinity", "make_router"]


class RoundRobin(Router):
    name = "round_robin"

    def __init__(self, seed: int = 0) -> None:
        self._next = 0

    def pick(self, replicas: Sequence[ReplicaView], request: RouteRequest) -> int:
        i = self._next % len(replicas)
        self._next += 1
        return i


class LeastOutstanding(Router):
    name = "least_outstanding"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def pick(self, replicas: Sequence[ReplicaView], request: RouteRequest) -> int:
        n = len(replicas)
        if n <= 2:
            a, b = 0, n - 1
        else:
            a, b = self._rng.sample(range(n), 2)
        ka = (replicas[a].outstanding, a)
        kb = (replicas[b].outstanding, b)
        return a if ka <= kb else b


_BY_NAME: dict[str, type[Router]] = {r.name: r for r in (RoundRobin, LeastOutstanding,
                                                          PrefixAffinity)}


def make_router(name: str, seed: int = 0, block_size: int = 16,
                prefix_affinity: PrefixAffinityOptions | None = None) -> Router:
    """A router by name; `block_size` (the pool's KV block) and `prefix_affinity` (its
    knobs) matter to prefix_affinity only."""
    cls = _BY_NAME.get(name)
    if cls is None:
        raise ValueError(f"router = {name!r}: must be one of {', '.join(ROUTERS)}")
    if cls is PrefixAffinity:
        return PrefixAffinity(seed, block_size, prefix_affinity)
    return cls(seed)
