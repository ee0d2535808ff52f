"""Putting a Deployment (routing/pools.py) on Ray Serve: one Ray Serve application per
pool, `replicas` engine replicas each with the pool's engine config, routed within the
pool by StepserveRequestRouter; and taking them down again (each replica drains first:
Ray Serve lets in-flight requests finish for up to the shutdown timeout)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stepserve.cluster.messages import ReplicaSpec
from stepserve.cluster.replica import EngineReplica
from stepserve.config.load import to_dict
from stepserve.config.settings import EngineConfig
from stepserve.routing.pools import Deployment

ROUTER_CLASS = "stepserve.cluster.request_router.StepserveRequestRouter"
APP_PREFIX = "stepserve-"
# The engine admits and queues (429 when its queue is full); Ray never holds one back.
MAX_ONGOING_REQUESTS = 100_000


@dataclass(frozen=True)
class ReplicaSettings:
    model_dir: str
    model_name: str
    dtype: str = "float32"
    device: str = "cpu"
    cpus_per_replica: float = 1.0  # Ray's CPU reservation; torch threads: at least 1
    routing_stats_period_s: float = 0.5
    health_check_period_s: float = 2.0
    shutdown_timeout_s: float = 30.0
    seed: int = 0


def deploy(deployment: Deployment, base: EngineConfig, pools_file: str | None,
           settings: ReplicaSettings) -> dict[str, Any]:
    """Deploy every pool and wait until its replicas are up; {pool: handle}."""
    from ray import serve

    handles: dict[str, Any] = {}
    first = 0
    for pool in deployment.pools:
        app = _pool_deployment(pool.name, pool.replicas, first, pool.config, base,
                               pools_file, settings)
        handles[pool.name] = serve.run(app, name=APP_PREFIX + pool.name, route_prefix=None)
        first += pool.replicas
    return handles


def _pool_deployment(pool: str, replicas: int, first: int, config: EngineConfig,
                     base: EngineConfig, pools_file: str | None, s: ReplicaSettings):
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    spec = ReplicaSpec(s.model_dir, s.model_name, to_dict(config.replace(replicas=1)), pool,
                       first, s.dtype, s.device, max(1, round(s.cpus_per_replica)))
    router = RequestRouterConfig(
        request_router_class=ROUTER_CLASS,
        request_router_kwargs={"pool": pool, "base": to_dict(base), "pools_file": pools_file,
                               "seed": s.seed},
        request_routing_stats_period_s=s.routing_stats_period_s,
        request_routing_stats_timeout_s=max(5.0, 4 * s.routing_stats_period_s))
    return serve.deployment(EngineReplica).options(
        name=f"engine-{pool}", num_replicas=replicas,
        ray_actor_options={"num_cpus": s.cpus_per_replica},
        max_ongoing_requests=MAX_ONGOING_REQUESTS,
        health_check_period_s=s.health_check_period_s,
        health_check_timeout_s=max(10.0, 5 * s.health_check_period_s),
        graceful_shutdown_wait_loop_s=0.2,
        graceful_shutdown_timeout_s=s.shutdown_timeout_s,
        request_router_config=router).bind(spec)


def describe(handles: Mapping[str, Any]) -> dict[str, dict]:
    """{pool: one replica's describe()} (max_model_len, vocab size, runner)."""
    return {pool: h.describe.remote().result() for pool, h in handles.items()}


def undeploy(pools: list[str]) -> None:
    """Delete the pools' applications (each replica drains first) and wait."""
    from ray import serve

    for pool in pools:
        serve.delete(APP_PREFIX + pool)
