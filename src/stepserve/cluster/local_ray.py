"""Starting or joining Ray and Ray Serve for the replicas.

A local instance (no `--ray-address`) is loopback only: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
off (read at `import ray`) binds its GCS, raylet, workers and agents to the loopback; no
dashboard, no Ray Serve HTTP proxy. A replica's gRPC server binds "[::]:0" whatever the
node address (Ray 2.60): `keep_replica_grpc_on_node_ip` points it at the loopback. Its
workers run at our priority (a joined cluster keeps its own): at Ray's default nice 15 a
replica loses its cores to any normal process (beside two busy loops, minutes to start).
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("stepserve.cluster")

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK_ADDRESSES = ("127.0.0.1", "::1", "localhost")
WORKER_NICENESS_ENV = "RAY_worker_niceness"  # read by the raylet a local ray.init starts


def prefer_loopback() -> None:
    """Before `import ray`: a local Ray instance takes 127.0.0.1 as its node address."""
    if "ray" in sys.modules:
        return  # too late to matter; start_ray says so if the address is not loopback
    os.environ.setdefault(LOOPBACK_ENV, "0")


def start_ray(address: str | None, num_cpus: int | None = None,
              log_to_driver: bool = True) -> str:
    """Join the cluster at `address`, or start a local loopback-only instance; then Ray
    Serve without its HTTP proxy. Returns the node address."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        if address is None:
            os.environ.setdefault(WORKER_NICENESS_ENV, "0")
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=log_to_driver,
                     configure_logging=False)
        else:
            ray.init(address=address, log_to_driver=log_to_driver, configure_logging=False)
    node_ip = ray.util.get_node_ip_address()
    if address is None and node_ip not in LOOPBACK_ADDRESSES:
        log.warning("the local Ray instance listens on %s, not only on the loopback "
                    "(ray was imported before stepserve could set %s=0)", node_ip,
                    LOOPBACK_ENV)
    serve.start(proxy_location="Disabled")
    return node_ip


def keep_replica_grpc_on_node_ip() -> None:
    """In a replica, before Ray Serve starts its inter-deployment gRPC server: bind it to
    the node address instead of every interface, when that address is a loopback one."""
    import ray
    import ray.serve._private.replica as replica_module

    node_ip = ray.util.get_node_ip_address()
    add_port = getattr(replica_module, "add_port_to_grpc_server", None)
    if node_ip not in LOOPBACK_ADDRESSES or add_port is None \
            or getattr(add_port, "stepserve_loopback", False):  # patched already
        return

    def on_node_ip(server, address: str):
        return add_port(server, address.replace("[::]", node_ip, 1))

    on_node_ip.stepserve_loopback = True  # type: ignore[attr-defined]
    replica_module.add_port_to_grpc_server = on_node_ip
