"""What crosses the Ray seam between the ingress and a replica: how to build a replica
(ReplicaSettings), the first item of every generate stream (Admission) and the load a
replica reports to the router (ReplicaStats, as the plain dict Ray Serve requires).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from stepserve.routing.routers import ReplicaView


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
    vllm_metric_names: bool = True  # /metrics carries vLLM's names too (vllm:)


@dataclass(frozen=True, slots=True)
class Admission:
    """Whether the replica's engine took the request. `error`: None (taken), "rejected"
    (RequestRejected, with its `reason`, and the field at fault and error code where the
    engine named them), "failed" (RequestFailed) or "unavailable"."""

    engine: int
    pool: str
    error: str | None = None
    reason: str = ""
    message: str = ""
    param: str | None = None
    code: str | None = None


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    engine: int  # the replica's index in the whole deployment (the `engine` label)
    pool: str
    pid: int
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    requests_admitted: int = 0  # since the replica (process) started
    fault: str | None = None  # why its engine loop died

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplicaStats | None:
        """None for a replica that has not reported yet (an empty dict)."""
        if not data or "engine" not in data:
            return None
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def view(self, outstanding: int) -> ReplicaView:
        """The router's view. `outstanding`: requests the ingress has in flight there,
        fresher than the reported queue (reports come every routing-stats period)."""
        running = min(self.running, outstanding)
        return ReplicaView(self.engine, self.pool, outstanding - running, running,
                           self.kv_usage)
