"""`stepserve serve --replicas N [--pools FILE] [--ray-address ADDR]`'s job: engine
replicas on Ray Serve behind one OpenAI-compatible ingress (this process).

    Ray: pool "online": replicas 0..1   pool "offline": replica 2     (deploy.py)
          ^ StepserveRequestRouter picks the replica (routing/, request_router.py)
    this process: uvicorn + the ingress app (app.py) -> ClusterEngine (frontend.py)
                  picks the pool by the deployment's rules

On SIGINT/SIGTERM the ingress drains like the single-process server (stop admitting,
let in-flight requests finish for the shutdown timeout, abort the rest), then every
pool's replicas are deleted (Ray Serve drains each first) and a local Ray stops.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from stepserve.cluster.deploy import ReplicaSettings
from stepserve.cluster.extra import require_ray_serve
from stepserve.cluster.frontend import ClusterEngine
from stepserve.cluster.local_ray import prefer_loopback
from stepserve.config.errors import UsageError
from stepserve.config.load import ConfigOverrides
from stepserve.config.settings import ConfigError, EngineConfig
from stepserve.core.request_limits import DEFAULT_MAX_REQUEST_BYTES
from stepserve.routing.pools import Deployment, load_deployment
from stepserve.server.connection_limits import ConnectionLimits

log = logging.getLogger("stepserve.cluster")


@dataclass(frozen=True)
class ClusterServeOptions:
    model: str = "default"
    served_model_name: str | None = None
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


def plan_deployment(o: ClusterServeOptions) -> tuple[EngineConfig, Deployment]:
    """The engine config every pool starts from and the deployment (ConfigError names
    what is wrong)."""
    base = o.config.apply()
    if o.pools_file is None:
        return base, Deployment.single(base)
    return base, load_deployment(o.pools_file, base)


def absolute_pools_file(o: ClusterServeOptions) -> ClusterServeOptions:
    """The request routers read the pools file again, from wherever Ray runs them."""
    if o.pools_file is None:
        return o
    return replace(o, pools_file=str(Path(o.pools_file).resolve()))


def run_cluster_serve(options: ClusterServeOptions) -> int:
    """Serve until a signal; the exit status (2: a mistake found before any work). The
    caller has checked that host:port can be listened on."""
    o = absolute_pools_file(options)
    if o.ray_address is None:
        prefer_loopback()  # before anything imports ray
    try:
        require_ray_serve("stepserve serve --replicas/--pools/--ray-address")
        base, deployment = plan_deployment(o)
        from stepserve.model.presets import resolve_model

        model_dir = resolve_model(o.model)  # a preset is built here, once, not per replica
    except (UsageError, ConfigError, ValueError, FileNotFoundError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=o.log_level.upper(),
                        format="%(levelname)s %(name)s: %(message)s")
    return _serve(o, base, deployment, str(model_dir))


@dataclass
class Ingress:
    app: Any  # the FastAPI app (app.py)
    cluster: ClusterEngine
    runner: str  # one replica's runner, described


def build_ingress(deployment: Deployment, base: EngineConfig, pools_file: str | None,
                  replicas: ReplicaSettings, retry_after_s: int = 1,
                  shutdown_timeout_s: float = 30.0,
                  max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                  api_keys: tuple[str, ...] = ()) -> Ingress:
    """Deploy the pools on the Ray Serve this process is connected to, and the ingress
    app over them (not yet serving)."""
    from stepserve.cluster.app import IngressSettings, create_ingress_app
    from stepserve.cluster.deploy import deploy, describe
    from stepserve.model.tokenizer import Tokenizer

    handles = deploy(deployment, base, pools_file, replicas)
    facts = describe(handles)
    tokenizer = Tokenizer(replicas.model_dir)
    max_len = max(f["max_model_len"] for f in facts.values())
    first = next(iter(facts.values()))
    settings = IngressSettings(replicas.model_name, max_len, first["vocab_size"],
                               max_len * tokenizer.max_token_bytes(), retry_after_s,
                               shutdown_timeout_s, max_request_bytes, api_keys)
    cluster = ClusterEngine(deployment, handles)
    return Ingress(create_ingress_app(cluster, settings, tokenizer), cluster, first["runner"])


def _serve(o: ClusterServeOptions, base: EngineConfig, deployment: Deployment,
           model_dir: str) -> int:
    import ray

    from stepserve.cluster.deploy import undeploy
    from stepserve.cluster.local_ray import start_ray
    from stepserve.server.http_server import make_server

    name = o.served_model_name or str(o.model)
    node_ip = start_ray(o.ray_address, o.num_cpus)
    try:
        settings = ReplicaSettings(model_dir, name, o.dtype, o.device, o.cpus_per_replica,
                                   shutdown_timeout_s=o.shutdown_timeout_s)
        ingress = build_ingress(deployment, base, o.pools_file, settings, o.retry_after_s,
                                o.shutdown_timeout_s, o.max_request_bytes, o.api_keys)
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
