"""Pools: named groups of replicas, each with its own engine config, and the rules that
send a request to a pool by its class; a deployment is the pools plus those rules.

A pools file (`--pools FILE`: serve, simulate, sweep) with the incidents' fixes (separate
pools, a request-length cap):

    replicas: 3                    # no pools: this many identical replicas
    router: least_outstanding      # within a pool: round_robin, least_outstanding,
                                   # prefix_affinity (its knobs: `prefix_affinity: {...}`)
    scheduler: {max_num_batched_tokens: 8192}   # engine settings every pool starts from
    pools:
      online:  {replicas: 2, scheduler: {max_num_seqs: 16, long_prefill_token_threshold: 512}}
      offline: {replicas: 1, scheduler: {max_num_seqs: 128}}
    routing:
      default: online
      rules:                       # the first that matches wins
        - {prompt_tokens_over: 4096, pool: offline}    # over-long requests apart
        - {max_tokens_over: 1200, pool: offline}
        - {priority_at_least: 1, pool: offline}        # vLLM: lower runs first
        - {tenant: [nightly-report], pool: offline}
        - {header: {x-pool: offline}, pool: offline}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from stepserve.config.load import apply_nested
from stepserve.config.settings import ConfigError, EngineConfig
from stepserve.config.user_files import preview
from stepserve.config.validate import Allowed
from stepserve.routing.routers import (
    PrefixAffinityOptions,
    ReplicaView,
    Router,
    RouteRequest,
    make_router,
)

DEPLOYMENT_KEYS = ("pools", "routing", "prefix_affinity")
RULE_KEYS = ("prompt_tokens_over", "max_tokens_over", "priority_at_least", "tenant", "header")


@dataclass(frozen=True)
class Rule:
    """Send a request to `pool` when every condition given holds."""

    pool: str
    prompt_tokens_over: int | None = None
    max_tokens_over: int | None = None
    priority_at_least: int | None = None
    tenants: tuple[str, ...] = ()
    header: tuple[str, str] | None = None  # (lower-cased name, value)

    def matches(self, r: RouteRequest) -> bool:
        return ((self.prompt_tokens_over is None or r.prompt_tokens > self.prompt_tokens_over)
                and (self.max_tokens_over is None or r.max_tokens > self.max_tokens_over)
                and (self.priority_at_least is None or r.priority >= self.priority_at_least)
                and (not self.tenants or r.tenant in self.tenants)
                and (self.header is None or r.headers.get(self.header[0]) == self.header[1]))

    def describe(self) -> str:
        parts = [f"{k} {v}" for k, v in (("prompt tokens >", self.prompt_tokens_over),
                                          ("max_tokens >", self.max_tokens_over),
                                          ("priority >=", self.priority_at_least))
                 if v is not None]
        if self.tenants:
            parts.append(f"user in {list(self.tenants)}")
        if self.header:
            parts.append(f"header {self.header[0]}: {self.header[1]}")
        return f"{' and '.join(parts) or 'always'} -> {self.pool}"


@dataclass(frozen=True)
class Pool:
    name: str
    replicas: int
    config: EngineConfig


@dataclass(frozen=True)
class Deployment:
    pools: tuple[Pool, ...]
    rules: tuple[Rule, ...] = ()
    default_pool: str = "default"
    router: str = "round_robin"
    prefix_affinity: PrefixAffinityOptions = PrefixAffinityOptions()

    @classmethod
    def single(cls, config: EngineConfig) -> Deployment:
        """`config.replicas` identical replicas in one pool (no rules)."""
        return cls((Pool("default", config.replicas, config),), (), "default", config.router)

    @property
    def num_replicas(self) -> int:
        return sum(p.replicas for p in self.pools)

    def replica_pools(self) -> list[Pool]:
        """The pool of each replica, in replica order (pools in file order)."""
        return [p for p in self.pools for _ in range(p.replicas)]

    def pool_for(self, request: RouteRequest) -> str:
        return next((r.pool for r in self.rules if r.matches(request)), self.default_pool)

    def describe(self) -> dict[str, Any]:
        """The layout as plain data, for result files and tables."""
        out = {"router": self.router, "pools": {p.name: p.replicas for p in self.pools},
               "default": self.default_pool, "rules": [r.describe() for r in self.rules]}
        if self.router == "prefix_affinity":
            out["prefix_affinity"] = asdict(self.prefix_affinity)
        return out


class PoolRouter:
    """Pick a pool by the rules, then a replica in it with the pool's router."""

    def __init__(self, deployment: Deployment, seed: int = 0) -> None:
        self.deployment = deployment
        self._routers: dict[str, Router] = {
            p.name: make_router(deployment.router, seed + i, p.config.cache.block_size,
                                deployment.prefix_affinity)
            for i, p in enumerate(deployment.pools)}

    def pick(self, replicas: Sequence[ReplicaView], request: RouteRequest) -> int:
        """The position in `replicas` (every replica of the deployment) to send to."""
        pool = self.deployment.pool_for(request)
        members = [i for i, r in enumerate(replicas) if r.pool == pool]
        if not members:
            raise RuntimeError(f"pool {pool!r} has no replica")
        chosen = self._routers[pool].pick([replicas[i] for i in members], request)
        return members[chosen]


def deployment_from(data: Mapping[str, Any], base: EngineConfig) -> Deployment:
    """A deployment from a pools file's contents (see the module doc); engine settings
    outside `pools`/`routing` apply to every pool. ConfigError names what is wrong."""
    engine = {k: v for k, v in data.items() if k not in DEPLOYMENT_KEYS}
    common = apply_nested(base, engine)
    options = PrefixAffinityOptions()
    if "prefix_affinity" in data:
        if common.router != "prefix_affinity":
            raise ConfigError(f"prefix_affinity: knobs of the prefix_affinity router, but "
                              f"router is {common.router}; set `router: prefix_affinity` or "
                              "remove them")
        options = PrefixAffinityOptions.from_mapping(data["prefix_affinity"])
    pools_data = data.get("pools")
    if pools_data is None:
        if "routing" in data:
            raise ConfigError("routing: rules need `pools` to send requests to")
        return replace(Deployment.single(common), prefix_affinity=options)
    if not isinstance(pools_data, Mapping) or not pools_data:
        raise ConfigError("pools: must map pool names to their settings")
    pools = tuple(_pool(name, spec, common) for name, spec in pools_data.items())
    routing = data.get("routing") or {}
    if not isinstance(routing, Mapping):
        raise ConfigError("routing: must be a mapping with `default` and `rules`")
    names = [p.name for p in pools]
    default = routing.get("default", names[0])
    raw_rules = routing.get("rules") or []
    if not isinstance(raw_rules, list):
        raise ConfigError(f"routing.rules = {preview(raw_rules)}: must be a list of rules")
    rules = tuple(_rule(i, r, names) for i, r in enumerate(raw_rules))
    if default not in names:
        raise ConfigError(f"routing.default = {preview(default)}: not a pool ({', '.join(names)})")
    return Deployment(pools, rules, default, common.router, options)


def _pool(name: Any, spec: Any, common: EngineConfig) -> Pool:
    if not isinstance(name, str) or not isinstance(spec, Mapping):
        raise ConfigError(f"pools.{name}: must be a mapping of settings")
    replicas = Allowed(1, 64).check(f"pools.{name}.replicas", spec.get("replicas", 1),
                                    ConfigError)
    try:
        config = apply_nested(common, {k: v for k, v in spec.items() if k != "replicas"})
    except ConfigError as e:
        raise ConfigError(f"pools.{name}: {e}") from None
    return Pool(name, replicas, config)


def _rule(i: int, data: Any, pools: list[str]) -> Rule:
    where = f"routing.rules[{i}]"
    if not isinstance(data, Mapping) or data.get("pool") not in pools:
        raise ConfigError(f"{where}: needs `pool`, one of {', '.join(pools)}")
    unknown = set(data) - {"pool", *RULE_KEYS}
    if unknown or len(data) < 2:
        got = sorted(preview(k) for k in set(data) - {"pool"})
        raise ConfigError(f"{where}: conditions are {', '.join(RULE_KEYS)}; got "
                          f"[{', '.join(got)}]")
    limits = [data.get(key) for key in RULE_KEYS[:3]]
    for key, value in zip(RULE_KEYS, limits):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(f"{where}.{key} = {preview(value)}: must be an integer")
    tenants = data.get("tenant", ())
    tenants = (tenants,) if isinstance(tenants, str) else tenants
    if not isinstance(tenants, (list, tuple)) or not all(isinstance(t, str) for t in tenants):
        raise ConfigError(f"{where}.tenant = {preview(data.get('tenant'))}: must be a tenant "
                          "name or a list of them")
    header = data.get("header")
    if header is not None:
        if not isinstance(header, Mapping) or len(header) != 1:
            raise ConfigError(f"{where}.header: must be one {{name: value}}")
        ((name, value),) = header.items()
        header = (str(name).lower(), str(value))
    return Rule(data["pool"], *limits, tuple(tenants), header)


def load_pools_file(path: str, base: EngineConfig) -> Mapping[str, Any]:
    """A pools file's contents (see the module doc), checked by building its deployment
    over `base`; every error names the file. Callers that vary the engine settings (a
    sweep) build the deployment over each config with `deployment_from`."""
    from stepserve.config.user_files import load_yaml

    data = load_yaml(path, "pools file")
    if not isinstance(data, Mapping):
        raise ConfigError(f"pools file {path!r}: must be a mapping (pools, routing, ...)")
    try:
        deployment_from(data, base)
    except ConfigError as e:
        raise ConfigError(f"pools file {path!r}: {e}") from None
    return data


def load_deployment(path: str | None, base: EngineConfig) -> Deployment:
    """A pools file's deployment over `base` (every error names the file); no file:
    `base`'s replicas in one pool."""
    if path is None:
        return Deployment.single(base)
    return deployment_from(load_pools_file(path, base), base)
