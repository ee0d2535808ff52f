"""StepserveRequestRouter: Ray Serve's request router for a pool's deployment, deciding
with the simulator's PoolRouter over a ReplicaView of each live replica: the load it
reported (`record_routing_stats`, every routing-stats period) and its outstanding
requests counted here as they are sent and end, so a burst between two reports does not
all see the same stale queue. `target=<engine index>` (the ingress's per-replica calls)
goes to that replica; a call with no `route` to any. Each router registers itself in
registry.ROUTERS under its pool, for the ingress to list the live replicas.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from stepserve.cluster.messages import ReplicaStats
from stepserve.config.load import apply_nested
from stepserve.config.settings import EngineConfig
from stepserve.routing.pools import PoolRouter, load_deployment
from stepserve.routing.routers import ReplicaView

GENERATE = "generate"


class StepserveRequestRouter(RequestRouter):
    def initialize_state(self, pool: str = "default", base: dict[str, Any] | None = None,
                         pools_file: str | None = None, seed: int = 0, **_: Any) -> None:
        """`base` (the engine config the pools start from, as JSON: Ray passes it on as
        is) and the pools file, read here again, make the deployment."""
        self.pool = pool
        deployment = load_deployment(pools_file, apply_nested(EngineConfig(), base or {}))
        self.pool_router = PoolRouter(deployment, seed)
        self._outstanding: dict[ReplicaID, int] = defaultdict(int)
        self._sent: dict[str, ReplicaID] = {}  # internal request id -> replica
        from stepserve.cluster import registry  # not a global: see registry.py

        registry.ROUTERS[pool] = self

    # ---- what the ingress reads ----
    def replica_stats(self) -> list[ReplicaStats]:
        """The live replicas that have reported, by engine index."""
        stats = [ReplicaStats.from_dict(r.routing_stats)
                 for r in list(self.curr_replicas.values())]
        return sorted((s for s in stats if s is not None), key=lambda s: s.engine)

    # ---- Ray Serve's calls ----
    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        kwargs = pending_request.kwargs if pending_request is not None else {}
        # by engine index; one not reported yet (just started) last
        ranked = sorted(((ReplicaStats.from_dict(r.routing_stats), r)
                         for r in candidate_replicas),
                        key=lambda sr: (sr[0].engine if sr[0] else 1 << 30,
                                        sr[1].replica_id.unique_id))
        if (target := kwargs.get("target")) is not None:
            return [[r for s, r in ranked if s is not None and s.engine == target]]
        route = kwargs.get("route")
        if route is None or not ranked:
            return [[r for _, r in ranked]]
        views = []
        for position, (stats, replica) in enumerate(ranked):
            outstanding = self._outstanding.get(replica.replica_id, 0)
            views.append(ReplicaView(position, self.pool, outstanding, 0, 0.0)
                         if stats is None else stats.view(outstanding))
        return [[ranked[self.pool_router.pick(views, route)][1]]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        if pending_request.metadata.call_method == GENERATE:
            self._outstanding[replica_id] += 1
            self._sent[pending_request.metadata.internal_request_id] = replica_id

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        sent_to = self._sent.pop(internal_request_id, None)
        if sent_to is not None and self._outstanding[sent_to] > 0:
            self._outstanding[sent_to] -= 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._outstanding.pop(replica_id, None)
