"""EngineReplica: one engine in its own process, as a Ray Serve deployment replica. It
wraps its LLMEngine exactly as the single-process server does (server/async_engine.py:
the engine thread, one stream per request, the exactly-once answer) and streams each
request's StreamOutputs back to the ingress.

Ray Serve calls:
* `generate(...)` (streamed): first an Admission, then the request's StreamOutputs; a
  cancelled stream (the ingress stopped reading) aborts the request here.
* `abort(request_id, message)`: the ingress's abort (a client gone, a drain cut), ended
  by this engine, its final output sent on the request's stream.
* `record_routing_stats()`: the ReplicaStats the request router builds its view from.
* `check_health()`: raises once the engine loop died, so Ray Serve restarts the replica.
* `health()`, `metrics_text()`: the ingress's per-replica /health and merged /metrics.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator

from stepserve.cluster.messages import Admission, ReplicaSpec, ReplicaStats
from stepserve.config.load import apply_nested
from stepserve.config.settings import EngineConfig
from stepserve.engine.seam import (
    EngineUnavailable,
    NewRequest,
    RequestFailed,
    RequestRejected,
)

log = logging.getLogger("stepserve.cluster")


class EngineReplica:
    def __init__(self, spec: ReplicaSpec) -> None:
        import torch

        from stepserve.cluster.local_ray import keep_replica_grpc_on_node_ip
        from stepserve.engine.llm_engine import LLMEngine
        from stepserve.server.metrics import ServerMetrics

        keep_replica_grpc_on_node_ip()
        torch.set_num_threads(spec.torch_threads)
        config = apply_nested(EngineConfig(), spec.config)
        self.spec = spec
        self.engine_index = spec.first_engine + _replica_rank()
        self.llm_engine = LLMEngine(spec.model_dir, config, dtype=spec.dtype,
                                    device=spec.device)
        self.metrics = ServerMetrics(spec.model_name, self.llm_engine.config.scheduler,
                                     engine=str(self.engine_index))
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
        me = (self.engine_index, self.spec.pool)
        try:
            stream = await engine.add(request)
        except RequestRejected as e:
            self.metrics.on_rejected(e.reason)
            yield Admission(*me, "rejected", e.reason, e.message, e.param, e.code)
            return
        except RequestFailed as e:
            yield Admission(*me, "failed", message=str(e))
            return
        except EngineUnavailable as e:
            yield Admission(*me, "unavailable", message=str(e))
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
        """End a request in this replica's engine (the ingress's abort; `target`: read by
        the request router): its final output goes out on the request's stream."""
        if self._engine is not None:
            self._engine.abort(request_id, message)

    def stats(self) -> ReplicaStats:
        engine = self._engine
        state = engine.state if engine is not None else None
        return ReplicaStats(
            self.engine_index, self.spec.pool, os.getpid(),
            state.num_waiting if state else 0, state.num_running if state else 0,
            state.kv_usage if state else 0.0, self.admitted,
            engine.fault if engine is not None else None)

    def record_routing_stats(self) -> dict:
        return self.stats().to_dict()

    # `target`: the engine index the request router sent the call to (its kwarg)
    async def health(self, target: int | None = None) -> dict:
        s = self.stats()
        engine = self._async_engine()
        status = "ok" if engine.is_running else "engine_down"
        return {**s.to_dict(), "status": status, "steps": engine.state.steps}

    def metrics_text(self, target: int | None = None) -> str:
        return self.metrics.render().decode()

    def describe(self) -> dict:
        """What the ingress needs to check requests before they reach a replica."""
        args = self.llm_engine.runner.args
        return {"max_model_len": self.llm_engine.config.scheduler.max_model_len,
                "vocab_size": args.vocab_size, "engine": self.engine_index,
                "runner": self.llm_engine.runner.describe()}

    def check_health(self) -> None:
        engine = self._engine
        if engine is not None and engine.fault is not None:
            raise RuntimeError(f"engine {self.engine_index} ({self.spec.pool}): "
                               f"{engine.fault}")


def _replica_rank() -> int:
    """This replica's rank in its deployment (Ray Serve keeps ranks 0..n-1 and gives a
    restarted replica the rank of the one it replaces)."""
    from ray import serve

    rank = serve.get_replica_context().rank
    return int(getattr(rank, "rank", rank))
