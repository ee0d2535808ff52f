"""Routers: which replica of a pool gets a request, from what a router sees: each
replica's load (ReplicaView; a simulator replica builds it from its scheduler, a cluster
replica reports the same numbers to Ray Serve's router) and the request (RouteRequest).

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


# made for every routing decision: not frozen (a frozen class's __init__ costs ~6x)
@dataclass(slots=True)
class ReplicaView:
    index: int  # position in the deployment, stable for the replica's life
    pool: str = "default"
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0  # share of KV blocks in use, 0..1

    @property
    def outstanding(self) -> int:
        """Requests it holds: the queue length a least-outstanding router compares."""
        return self.waiting + self.running


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """The facts about a request a routing rule may look at."""

    prompt_tokens: int
    max_tokens: int
    priority: int = 0  # lower runs first, as in vLLM
    tenant: str = "default"  # the OpenAI `user` field
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-cased names
    prompt_token_ids: Sequence[int] = ()  # what a prefix-aware router hashes
    cache_salt: str | None = None  # the prefix cache's namespace (core/prefix_hash.py)

    def __reduce__(self) -> tuple:
        # Pickled without the prompt: routers run where the request is routed (the
        # ingress), and a cluster replica gets the prompt as its own argument, so a long
        # prompt crosses the Ray seam once, not twice.
        return (RouteRequest, (self.prompt_tokens, self.max_tokens, self.priority,
                               self.tenant, dict(self.headers), (), self.cache_salt))


class Router:
    name = ""

    def pick(self, replicas: Sequence[ReplicaView], request: RouteRequest) -> int:
        """The position in `replicas` (never empty) of the replica to send to."""
        raise NotImplementedError


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
        return min(a, b, key=lambda k: (replicas[k].outstanding, k))
