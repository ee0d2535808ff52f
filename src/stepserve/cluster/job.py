"""`stepserve serve --replicas N [--pools FILE] [--ray-address ADDR]`: each pool one Ray
Serve application of engine replicas (StepserveRequestRouter picks the replica), behind
one OpenAI-compatible ingress in this process (app.py, frontend.py: it picks the pool).
On SIGINT/SIGTERM the ingress drains as the single-process server does, then every
pool's application is deleted (each replica drains first) and a local Ray stops.
"""

from __future__ import annotations

import importlib
import logging
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from stepserve.cluster.frontend import ClusterEngine
from stepserve.cluster.local_ray import prefer_loopback
from stepserve.cluster.messages import ReplicaSettings
from stepserve.config.errors import UsageError
from stepserve.config.load import ConfigOverrides, to_dict
from stepserve.config.settings import ConfigError, EngineConfig
from stepserve.core.request_limits import DEFAULT_MAX_REQUEST_BYTES
from stepserve.routing.pools import Deployment, load_deployment
from stepserve.server.connection_limits import ConnectionLimits

ROUTER_CLASS = "stepserve.cluster.request_router.StepserveRequestRouter"
APP_PREFIX = "stepserve-"
# The engine admits and queues (429 when its queue is full); Ray never holds one back.
MAX_ONGOING_REQUESTS = 100_000


@dataclass(frozen=True)
class ClusterServeOptions:
    model: str = "default"
    served_model_name: str | list[str] | None = None  # several: the first, then aliases
    host: str = "127.0.0.1"
    port: int = 8000
    dtype: str = "float32"
    device: str = "cpu"
    retry_after_s: int = 1
    shutdown_timeout_s: float = 30.0
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    log_level: str = "info"
    config: ConfigOverrides = ConfigOverrides()
    pools_file: str | None = None  # YAML: replicas, router, pools, routing
    ray_address: str | None = None  # join this cluster; None: a local loopback instance
    num_cpus: int | None = None  # CPUs of a local instance (None: all)
    # what one client connection may hold at the ingress (server/connection_limits.py)
    connection_limits: ConnectionLimits = ConnectionLimits()
    cpus_per_replica: float = 1.0
    api_keys: tuple[str, ...] = ()  # Bearer tokens the ingress requires (server/auth.py)
    metrics_require_api_key: bool = False  # /metrics needs one of them too
    vllm_metric_names: bool = True  # each replica's /metrics carries vLLM's names too


def plan_deployment(o: ClusterServeOptions) -> tuple[EngineConfig, Deployment]:
    """The engine config every pool starts from and the deployment (ConfigError names
    what is wrong)."""
    base = o.config.apply()
    return base, load_deployment(o.pools_file, base)


def run_cluster_serve(options: ClusterServeOptions) -> int:
    """Serve until a signal; the exit status (2: a mistake found before any work). The
    caller has checked that host:port can be listened on."""
    o = options
    if o.pools_file is not None:  # the request routers read it again, wherever Ray runs them
        o = replace(o, pools_file=str(Path(o.pools_file).resolve()))
    if o.ray_address is None:
        prefer_loopback()  # before anything imports ray
    try:
        try:
            importlib.import_module("ray.serve")
        except ImportError as e:
            raise UsageError("stepserve serve --replicas/--pools/--ray-address runs its "
                             f"replicas on Ray Serve, which is not installed ({e.name or e}): "
                             "pip install -e '.[cluster]'") from None
        base, deployment = plan_deployment(o)
        from stepserve.model.presets import resolve_model

        model_dir = resolve_model(o.model)  # a preset is built here, once, not per replica
    except (UsageError, ConfigError, ValueError, FileNotFoundError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=o.log_level.upper(),
                        format="%(levelname)s %(name)s: %(message)s")
    import ray

    from stepserve.cluster.local_ray import start_ray
    from stepserve.server.http_server import make_server
    from stepserve.server.serving import served_names

    names = served_names(o.served_model_name, o.model)
    name = names[0]
    node_ip = start_ray(o.ray_address, o.num_cpus)
    try:
        settings = ReplicaSettings(str(model_dir), name, o.dtype, o.device, o.cpus_per_replica,
                                   shutdown_timeout_s=o.shutdown_timeout_s,
                                   vllm_metric_names=o.vllm_metric_names)
        ingress = build_ingress(deployment, base, o.pools_file, settings, o.retry_after_s,
                                o.shutdown_timeout_s, o.max_request_bytes, o.api_keys,
                                o.metrics_require_api_key, tuple(names[1:]))
        layout = ", ".join(f"{p.name}: {p.replicas}" for p in deployment.pools)
        print(f"stepserve: serving {name!r} on http://{o.host}:{o.port}/v1: "
              f"{deployment.num_replicas} replicas on Ray Serve ({layout}; Ray node "
              f"{node_ip}; {ingress.runner})", file=sys.stderr)
        make_server(ingress.app, o.host, o.port, log_level=o.log_level,
                    limits=o.connection_limits).run()
    finally:
        undeploy([p.name for p in deployment.pools])
        ray.shutdown()
    print("stepserve: server stopped", file=sys.stderr)
    return 0


@dataclass
class Ingress:
    app: Any  # the FastAPI app (app.py)
    runner: str  # one replica's runner, described


def build_ingress(deployment: Deployment, base: EngineConfig, pools_file: str | None,
                  replicas: ReplicaSettings, retry_after_s: int = 1,
                  shutdown_timeout_s: float = 30.0,
                  max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                  api_keys: tuple[str, ...] = (),
                  metrics_require_api_key: bool = False,
                  aliases: tuple[str, ...] = ()) -> Ingress:
    """Deploy the pools on the Ray Serve this process is connected to, and the ingress
    app over them (not yet serving)."""
    from stepserve.cluster.app import IngressSettings, create_ingress_app
    from stepserve.model.tokenizer import Tokenizer

    handles = deploy(deployment, base, pools_file, replicas)
    facts = {pool: h.describe.remote().result() for pool, h in handles.items()}
    tokenizer = Tokenizer(replicas.model_dir)
    max_len = max(f["max_model_len"] for f in facts.values())
    first = next(iter(facts.values()))
    settings = IngressSettings(replicas.model_name, max_len, first["vocab_size"],
                               max_len * tokenizer.max_token_bytes(), retry_after_s,
                               shutdown_timeout_s, max_request_bytes, api_keys,
                               metrics_require_api_key, str(replicas.model_dir), aliases)
    app = create_ingress_app(ClusterEngine(deployment, handles), settings, tokenizer)
    return Ingress(app, first["runner"])


def deploy(deployment: Deployment, base: EngineConfig, pools_file: str | None,
           settings: ReplicaSettings) -> dict[str, Any]:
    """Deploy every pool and wait until its replicas are up; {pool: handle}."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from stepserve.cluster.replica import EngineReplica

    s = settings
    handles: dict[str, Any] = {}
    first = 0  # the engine index of the pool's replica of rank 0
    for pool in deployment.pools:
        router = RequestRouterConfig(
            request_router_class=ROUTER_CLASS,
            request_router_kwargs={"pool": pool.name, "base": to_dict(base),
                                   "pools_file": pools_file, "seed": s.seed},
            request_routing_stats_period_s=s.routing_stats_period_s,
            request_routing_stats_timeout_s=max(5.0, 4 * s.routing_stats_period_s))
        app = serve.deployment(EngineReplica).options(
            name=f"engine-{pool.name}", num_replicas=pool.replicas,
            ray_actor_options={"num_cpus": s.cpus_per_replica},
            max_ongoing_requests=MAX_ONGOING_REQUESTS,
            health_check_period_s=s.health_check_period_s,
            health_check_timeout_s=max(10.0, 5 * s.health_check_period_s),
            graceful_shutdown_wait_loop_s=0.2,
            graceful_shutdown_timeout_s=s.shutdown_timeout_s,
            request_router_config=router).bind(
                s, to_dict(pool.config.replace(replicas=1)), pool.name, first)
        handles[pool.name] = serve.run(app, name=APP_PREFIX + pool.name, route_prefix=None)
        first += pool.replicas
    return handles


def undeploy(pools: list[str]) -> None:
    """Delete the pools' applications (each replica drains first) and wait."""
    from ray import serve

    for pool in pools:
        serve.delete(APP_PREFIX + pool)
