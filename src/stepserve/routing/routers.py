"""Routers: which replica of a pool gets a request, from each replica's load
(ReplicaView: a simulator replica's from its scheduler, a cluster replica's as reported to
Ray Serve's router) and the request (RouteRequest). Deterministic for a given seed.

* round_robin: in turn.
* least_outstanding: power of two choices (Mitzenmacher): of two replicas drawn at random
  the one holding fewer requests wins, ties to the lower index; with two, the less loaded.
* prefix_affinity: where the prompt's prefix probably is. It cannot ask a replica's
  cache, so it remembers the block names (core/prefix_hash.py's, salted) it sent each
  replica in an LRU of `index_blocks` (the Gateway API Inference Extension's approximate
  prefix index), and scores each eligible replica

    prefix_weight * (leading blocks it was sent / the prompt's blocks)
  + queue_weight  * (1 - (outstanding - least) / (imbalance_threshold + 1))
  + kv_weight     * (1 - KV usage)

  (highest wins; ties: fewer outstanding, then the lower position). A replica more than
  `imbalance_threshold` above the least loaded is not eligible, so a hot prefix spreads
  instead of piling onto one replica; the queue term is measured against that threshold,
  so one request more is a small cost, not the whole of queue_weight.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from stepserve.config.settings import ROUTERS, ConfigError
from stepserve.config.user_files import preview
from stepserve.config.validate import Allowed
from stepserve.core.prefix_hash import BlockHash, namer


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


MAX_WEIGHT = 1000.0
MAX_THRESHOLD = 1_000_000
MAX_INDEX_BLOCKS = 1 << 20  # per replica: about 100 MB of names at the very most
MAX_PREFIX_BLOCKS = 1 << 14


@dataclass(frozen=True)
class PrefixAffinityOptions:
    """The router's knobs (a pools file's `prefix_affinity:` mapping)."""

    # The Gateway API Inference Extension's default weights: a full prefix match (3)
    # outweighs a replica at the imbalance threshold (queue term 2) or with a full KV (2).
    prefix_weight: float = 3.0
    queue_weight: float = 2.0
    kv_weight: float = 2.0
    # Outstanding requests a replica may hold beyond the least-loaded one and still be
    # chosen for its prefix; about one batch of new prompts' worth of imbalance.
    imbalance_threshold: int = 16
    # Block names remembered per replica: 16,384 blocks of 16 tokens is 256k tokens,
    # the KV a large accelerator holds, in about 2 MB of names.
    index_blocks: int = 16_384
    # Leading blocks of a prompt hashed and matched (a system prompt is its start): the
    # hashing a request costs is bounded, however long its prompt.
    max_prefix_blocks: int = 256

    def __post_init__(self) -> None:
        weight = Allowed(0, MAX_WEIGHT, float)
        for name in ("prefix_weight", "queue_weight", "kv_weight"):
            weight.check(f"prefix_affinity.{name}", getattr(self, name), ConfigError)
        for name, hi, lo in (("imbalance_threshold", MAX_THRESHOLD, 0),
                             ("index_blocks", MAX_INDEX_BLOCKS, 1),
                             ("max_prefix_blocks", MAX_PREFIX_BLOCKS, 1)):
            Allowed(lo, hi).check(f"prefix_affinity.{name}", getattr(self, name), ConfigError)

    @classmethod
    def from_mapping(cls, data: Any) -> PrefixAffinityOptions:
        if not isinstance(data, Mapping):
            raise ConfigError(f"prefix_affinity = {preview(data)}: must be a mapping of "
                              f"{', '.join(KNOBS)}")
        unknown = sorted(preview(k) for k in data if k not in KNOBS)
        if unknown:
            raise ConfigError(f"prefix_affinity: unknown {', '.join(unknown)}; the knobs are "
                              f"{', '.join(KNOBS)}")
        return cls(**data)


KNOBS = tuple(f.name for f in fields(PrefixAffinityOptions))


class PrefixAffinity(Router):
    name = "prefix_affinity"

    def __init__(self, seed: int = 0, block_size: int = 16,
                 options: PrefixAffinityOptions | None = None) -> None:
        self.block_size = block_size
        self.options = options or PrefixAffinityOptions()
        # by ReplicaView.index: the block names last sent there, oldest first
        self.index: dict[int, OrderedDict[BlockHash, None]] = {}

    def prompt_hashes(self, request: RouteRequest) -> list[BlockHash]:
        """The names of the prompt's leading full blocks, as the KV manager names them."""
        return namer().prompt_names(list(request.prompt_token_ids), request.cache_salt,
                                    self.block_size, self.options.max_prefix_blocks)

    def pick(self, replicas: Sequence[ReplicaView], request: RouteRequest) -> int:
        opts = self.options
        live = {r.index for r in replicas}  # a replica gone from a cluster: its index too
        for gone in [k for k in self.index if k not in live]:
            del self.index[gone]
        hashes = self.prompt_hashes(request)
        least = min(r.outstanding for r in replicas)
        eligible = [i for i, r in enumerate(replicas)
                    if r.outstanding <= least + opts.imbalance_threshold]
        span = opts.imbalance_threshold + 1

        def score(i: int) -> tuple[float, int, int]:
            r = replicas[i]
            names = self.index.get(r.index)
            prefix = 0.0
            if names and hashes:  # its leading blocks: a chain, so a gap ends the match
                held = next((k for k, h in enumerate(hashes) if h not in names), len(hashes))
                prefix = held / len(hashes)
            queue = 1.0 - (r.outstanding - least) / span
            total = (opts.prefix_weight * prefix + opts.queue_weight * queue
                     + opts.kv_weight * (1.0 - r.kv_usage))
            return (total, -r.outstanding, -i)

        chosen = max(eligible, key=score)
        names = self.index.setdefault(replicas[chosen].index, OrderedDict())
        for h in hashes:
            names[h] = None
            names.move_to_end(h)
        while len(names) > opts.index_blocks:
            names.popitem(last=False)
        return chosen


def make_router(name: str, seed: int = 0, block_size: int = 16,
                prefix_affinity: PrefixAffinityOptions | None = None) -> Router:
    """A router by name (config.py validates the names); `block_size` (the pool's KV
    block) and `prefix_affinity` (its knobs) matter to prefix_affinity only."""
    if name == PrefixAffinity.name:
        return PrefixAffinity(seed, block_size, prefix_affinity)
    for cls in (RoundRobin, LeastOutstanding):
        if name == cls.name:
            return cls(seed)
    raise ValueError(f"router = {name!r}: must be one of {', '.join(ROUTERS)}")
