"""EngineReplica: one engine in its own process, a Ray Serve replica, wrapped as the
single-process server wraps it (server/async_engine.py). Ray Serve calls it by name:
`generate` (an Admission, then the request's StreamOutputs; a cancelled stream aborts
it), `abort`, `record_routing_stats` (the router's view), `check_health` (raises once the
engine loop died: Ray Serve restarts the replica), `describe`, and `health` and
`metrics_text` for the ingress. `target`: the engine index the router sent a call to.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

from stepserve.cluster.messages import Admission, ReplicaSettings, ReplicaStats
from stepserve.config.load import apply_nested
from stepserve.config.settings import EngineConfig
from stepserve.engine.seam import EngineUnavailable, NewRequest, RequestFailed, RequestRejected


class EngineReplica:
    def __init__(self, settings: ReplicaSettings, config: dict[str, Any], pool: str,
                 first_engine: int) -> None:
        """`config`: the pool's engine config, YAML-shaped (config/load.to_dict);
        `first_engine`: the engine index of the pool's replica of rank 0."""
        import torch
        from ray import serve

        from stepserve.cluster.local_ray import keep_replica_grpc_on_node_ip
        from stepserve.engine.llm_engine import LLMEngine
        from stepserve.server.metrics import ServerMetrics

        keep_replica_grpc_on_node_ip()
        torch.set_num_threads(max(1, round(settings.cpus_per_replica)))
        self.pool = pool
        # Ray Serve keeps ranks 0..n-1 and gives a restarted replica its predecessor's
        rank = serve.get_replica_context().rank
        self.engine_index = first_engine + int(getattr(rank, "rank", rank))
        self.llm_engine = LLMEngine(settings.model_dir, apply_nested(EngineConfig(), config),
                                    dtype=settings.dtype, device=settings.device)
        self.metrics = ServerMetrics(settings.model_name, self.llm_engine.config.scheduler,
                                     engine=str(self.engine_index),
                                     vllm_names=settings.vllm_metric_names)
        self.admitted = 0
        self._engine = None  # AsyncEngine, started on this replica's event loop

    def _async_engine(self):
        if self._engine is None:
            from stepserve.server.async_engine import AsyncEngine

            self._engine = AsyncEngine(self.llm_engine, self.metrics)
            self._engine.start()
        return self._engine

    async def generate(self, request: NewRequest, route=None) -> AsyncIterator[object]:
        """`route` (the RouteRequest) is read by the request router, not here."""
        engine = self._async_engine()
        me = (self.engine_index, self.pool)
        try:
            stream = await engine.add(request)
        except RequestRejected as e:
            self.metrics.on_rejected(e.reason)
            yield Admission(*me, "rejected", e.reason, e.message, e.param, e.code)
            return
        except (RequestFailed, EngineUnavailable) as e:
            error = "failed" if isinstance(e, RequestFailed) else "unavailable"
            yield Admission(*me, error, message=str(e))
            return
        self.admitted += 1
        yield Admission(*me)
        try:
            async for out in stream:
                yield out
        finally:
            if not stream.finished:  # cancelled by the ingress: do not run unread
                engine.abort(stream.request_id, "cancelled by the ingress")

    async def abort(self, request_id: str, message: str, target: int | None = None) -> None:
        if self._engine is not None:
            self._engine.abort(request_id, message)

    def stats(self) -> ReplicaStats:
        engine, pid = self._engine, os.getpid()
        if engine is None:
            return ReplicaStats(self.engine_index, self.pool, pid, requests_admitted=self.admitted)
        state = engine.state
        return ReplicaStats(self.engine_index, self.pool, pid, state.num_waiting,
                            state.num_running, state.kv_usage, self.admitted, engine.fault)

    def record_routing_stats(self) -> dict:
        return self.stats().to_dict()

    async def health(self, target: int | None = None) -> dict:
        s = self.stats()
        engine = self._async_engine()
        status = "ok" if engine.is_running else "engine_down"
        return {**s.to_dict(), "status": status, "steps": engine.state.steps}

    def metrics_text(self, target: int | None = None) -> str:
        return self.metrics.render().decode()

    def describe(self) -> dict:
        """What the ingress needs to check requests before they reach a replica."""
        engine = self.llm_engine
        return {"max_model_len": engine.config.scheduler.max_model_len,
                "vocab_size": engine.runner.args.vocab_size, "engine": self.engine_index,
                "runner": engine.runner.describe()}

    def check_health(self) -> None:
        engine = self._engine
        if engine is not None and engine.fault is not None:
            raise RuntimeError(f"engine {self.engine_index} ({self.pool}): {engine.fault}")
