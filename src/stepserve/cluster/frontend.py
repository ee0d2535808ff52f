"""ClusterEngine: the ingress's engine, to serving.py's handlers what AsyncEngine is in
one process. It picks each request's pool by the deployment's rules and hands the
request to that pool's Ray Serve deployment, whose request router picks the replica.

Every accepted request gets exactly one final output: the replica's own (an abort's
too), or, where the replica dies mid-request or cannot be told to abort, a final "error"
output made here naming the replica. A replica that dies before it admitted a request
costs nothing: the request is sent again (the router no longer offers it).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from stepserve.cluster.messages import Admission
from stepserve.core.end_reasons import FinishReason, Refusal
from stepserve.engine.seam import (
    EngineUnavailable,
    NewRequest,
    RequestFailed,
    RequestRejected,
    RequestStream,
    StreamOutput,
)
from stepserve.routing.pools import Deployment
from stepserve.routing.routers import RouteRequest
from stepserve.server.async_engine import drain_live

log = logging.getLogger("stepserve.cluster")

# the headers (lower-cased) of the HTTP request being handled, for header routing rules
REQUEST_HEADERS: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "stepserve_request_headers", default=None)
ADMIT_TRIES = 3  # sends of a request whose replica died before admitting it


@dataclass
class _Live:
    stream: RequestStream
    pump: asyncio.Task
    generator: Any  # ray.serve DeploymentResponseGenerator
    admission: Admission
    last: StreamOutput | None = None
    aborting: asyncio.Task | None = None  # the call asking the replica to abort it


class ClusterEngine:
    def __init__(self, deployment: Deployment, handles: Mapping[str, Any]) -> None:
        self.deployment = deployment
        self.handles = dict(handles)  # pool name -> its deployment's handle
        self.accepting = True
        self.fault: str | None = None  # a cluster has no single engine to die
        self._live: dict[str, _Live] = {}
        self._all_ended = asyncio.Event()
        self._all_ended.set()
        self._drain_cut = asyncio.Event()

    @property
    def is_running(self) -> bool:
        return True

    @property
    def num_live(self) -> int:
        return len(self._live)

    # ---- requests ----
    async def add(self, request: NewRequest) -> RequestStream:
        """Send to a replica of the request's pool; return its stream once admitted.
        Raises RequestRejected, RequestFailed or EngineUnavailable as AsyncEngine.add
        does. (The replica stamps its own arrival time.)"""
        if not self.accepting:
            raise EngineUnavailable("the server is shutting down")
        params = request.params
        if params.n > 1:  # a replica answers one sequence per request stream here
            raise RequestRejected(
                f"n = {params.n} (or best_of): more than one choice per request is not "
                "supported through `serve --replicas` yet; send n requests, or serve one "
                "engine", Refusal.INVALID.value)
        route = RouteRequest(len(request.prompt_ids), params.max_tokens, params.priority,
                             params.tenant, REQUEST_HEADERS.get() or {}, request.prompt_ids,
                             request.cache_salt)
        pool = self.deployment.pool_for(route)
        rid = request.request_id or f"ing-{uuid.uuid4().hex}"
        sent = replace(request, request_id=rid, arrival_time=None)
        generator, admission = await self._admit(pool, sent, route)
        stream = RequestStream(rid, len(request.prompt_ids))
        pump = asyncio.ensure_future(self._pump(rid))
        self._live[rid] = _Live(stream, pump, generator, admission)
        self._all_ended.clear()
        return stream

    async def _admit(self, pool: str, request: NewRequest, route: RouteRequest):
        from ray.exceptions import RayActorError

        handle = self.handles[pool].options(stream=True)
        died: Exception | None = None
        for _ in range(ADMIT_TRIES):
            generator = handle.generate.remote(request, route=route)
            try:
                admission = await generator.__anext__()
            except RayActorError as e:  # died before admitting it: send it again
                died = e
                continue
            except StopAsyncIteration:
                raise RequestFailed(f"pool {pool!r}: the replica answered nothing") from None
            except BaseException:
                generator.cancel()
                raise
            _raise_for(admission)
            return generator, admission
        raise RequestFailed(f"pool {pool!r}: replicas died before taking the request "
                            f"({brief(died)})")

    async def _pump(self, rid: str) -> None:
        """Move the replica's outputs into the handler's stream until the final one."""
        live = self._live[rid]
        try:
            async for out in live.generator:
                live.last = out
                live.stream.put(out)
                if out.finished:
                    return
            self._fail(live, f"{_where(live)} ended the stream without a final output")
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("request %s: %s failed: %s", rid, _where(live), brief(e))
            self._fail(live, f"{_where(live)} failed while running the request: "
                             f"{brief(e)}")
        finally:
            self._forget(rid)

    def abort(self, request_id: str, message: str = "aborted by the client") -> None:
        """Ask the request's replica to end it (its final output then ends the stream).
        No-op if it already ended or is being aborted."""
        live = self._live.get(request_id)
        if live is None or live.aborting is not None:
            return
        live.aborting = asyncio.ensure_future(self._abort_on_replica(live, message))

    async def _abort_on_replica(self, live: _Live, message: str) -> None:
        a = live.admission
        call = self.handles[a.pool].abort.remote(live.stream.request_id, message,
                                                 target=a.engine)
        try:
            await call
        except Exception as e:  # its engine cannot be reached: stop reading it
            log.warning("request %s: aborting it on %s failed: %s", live.stream.request_id,
                        _where(live), brief(e))
            self._end_here(live, f"{_where(live)} could not be told to abort the request "
                                 f"({message}): {brief(e)}")

    def _end_here(self, live: _Live, message: str,
                  reason: FinishReason = FinishReason.ERROR) -> None:
        """Stop reading the replica (a cancelled stream aborts the request there, if
        anything is left of it) and answer the request here."""
        live.pump.cancel()
        live.generator.cancel()
        self._fail(live, message, reason)
        self._forget(live.stream.request_id)

    @staticmethod
    def _fail(live: _Live, message: str, reason: FinishReason = FinishReason.ERROR) -> None:
        """The answer when the replica cannot give one: a final output of its own."""
        if live.stream.all_put:
            return
        last = live.last
        live.stream.put(StreamOutput(
            "", live.stream.num_prompt_tokens, last.num_output_tokens if last else 0,
            finished=True, finish_reason=reason.value, message=message,
            full_text=last.full_text if last and last.full_text else ""))

    def _forget(self, rid: str) -> None:
        self._live.pop(rid, None)
        if not self._live:
            self._all_ended.set()

    # ---- shutdown ----
    async def drain(self, timeout_s: float) -> tuple[int, int]:
        """Stop admitting; let live requests finish for up to `timeout_s`, then abort the
        rest. Returns (finished during the drain, aborted)."""
        self.accepting = False
        return await drain_live(self._live, self._all_ended, self._drain_cut, self.abort,
                                timeout_s)

    def cut_drain(self) -> None:
        self._drain_cut.set()

    async def stop(self) -> None:
        """After the drain: stop reading what is left (their replicas abort them)."""
        for live in list(self._live.values()):
            self._end_here(live, "server stopped", FinishReason.ABORT)


def _raise_for(admission: Admission) -> None:
    if admission.error is None:
        return
    if admission.error == "rejected":
        raise RequestRejected(admission.message, admission.reason, admission.param,
                              admission.code)
    if admission.error == "failed":
        raise RequestFailed(admission.message)
    raise EngineUnavailable(f"engine {admission.engine} ({admission.pool}): "
                            f"{admission.message}")


def _where(live: _Live) -> str:
    a = live.admission
    return f"replica engine={a.engine} (pool {a.pool})"


def brief(error: BaseException | None) -> str:
    """The first line of an error (Ray's carry the remote traceback below it)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
