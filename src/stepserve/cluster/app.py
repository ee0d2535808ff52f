"""The ingress: the single-process server's API (server/serving.py, server/api.py)
over a ClusterEngine, plus the cluster's health and one merged /metrics.

    /health             public: 200 {"status": "ok"} while every pool has a live
                        replica, else 503 with a short reason (GET and HEAD)
    /health/{engine}    public, one replica, the same shape
    /cluster/replicas   every replica's own answer (pid, load, state), behind the API key
    /metrics            every replica's series labelled engine="<index>", pool="<name>"
                        (public, or behind the API key with --metrics-require-api-key)

The public probes say only healthy or not: pids and Ray's error texts are for operators.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from stepserve.cluster.frontend import REQUEST_HEADERS, ClusterEngine, brief
from stepserve.cluster.metrics_merge import merge_metrics
from stepserve.cluster.registry import ROUTERS
from stepserve.core.clock import WallClock
from stepserve.core.request_limits import DEFAULT_MAX_REQUEST_BYTES
from stepserve.server.api import (
    add_error_handlers,
    add_openai_routes,
    install_openapi,
    install_tokenize_routes,
)
from stepserve.server.auth import add_api_key_auth, check_key_settings
from stepserve.server.errors import NOT_FOUND, UNAVAILABLE, APIError
from stepserve.server.serving import ServingContext

log = logging.getLogger("stepserve.cluster")
REPLICA_CALL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class IngressSettings:
    model_name: str
    max_model_len: int
    vocab_size: int
    max_prompt_chars: int
    retry_after_s: int = 1
    shutdown_timeout_s: float = 30.0
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    api_keys: tuple[str, ...] = ()  # every route but the public ones needs one (auth.py)
    metrics_require_api_key: bool = False  # /metrics needs one too
    model_root: str | None = None  # /v1/models' root: the model's folder
    model_aliases: tuple[str, ...] = ()  # the other names a request may give as `model`

    def __post_init__(self) -> None:
        check_key_settings(self.api_keys, self.metrics_require_api_key)


def create_ingress_app(cluster: ClusterEngine, settings: IngressSettings,
                       tokenizer=None) -> FastAPI:
    """`tokenizer`: the model's, for the work the handlers do before a request is sent
    (templating, tokenizing, /tokenize); the replicas' engines check the rest."""
    s = settings

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.async_engine = cluster  # http_server's graceful shutdown drains it
        app.state.shutdown_timeout_s = s.shutdown_timeout_s
        app.state.ctx = ServingContext(cluster, tokenizer, WallClock(), s.model_name,
                                       s.max_model_len, s.vocab_size, s.retry_after_s,
                                       s.max_request_bytes, s.max_prompt_chars,
                                       s.model_root, s.model_aliases)
        try:
            yield
        finally:
            await cluster.drain(s.shutdown_timeout_s)
            await cluster.stop()
            app.state.ctx.workers.shutdown(wait=False)

    app = FastAPI(title="stepserve", version="0.1.0", lifespan=lifespan)
    add_error_handlers(app)
    install_openapi(app)
    add_api_key_auth(app, s.api_keys, s.metrics_require_api_key)

    @app.middleware("http")
    async def remember_headers(request: Request, call_next):
        token = REQUEST_HEADERS.set({k.lower(): v for k, v in request.headers.items()})
        try:
            return await call_next(request)
        finally:
            REQUEST_HEADERS.reset(token)

    add_openai_routes(app)
    install_tokenize_routes(app)

    @app.get("/health")
    async def health() -> Response:
        if not cluster.accepting:
            return _unhealthy("the server is shutting down", "shutting_down")
        _, down = await _answers(cluster)
        if down:
            return _unhealthy(f"no live replica in pool(s): {', '.join(down)}",
                              "no_live_replica")
        return JSONResponse({"status": "ok"})

    @app.get("/health/{engine}")
    async def replica_health(engine: int) -> Response:
        pools = {e: p for p, e in live_replicas(cluster)}
        if engine not in pools:
            return APIError(404, f"no live replica with engine index {engine}", NOT_FOUND,
                            code="replica_not_found").response()
        status = (await _health_of(cluster, pools[engine], engine)).get("status")
        if status != "ok":
            return _unhealthy(f"replica {engine}: {status}", "replica_down")
        return JSONResponse({"status": "ok"})

    # probes that send HEAD get GET's status (uvicorn drops the body); out of the
    # OpenAPI document, where the pair would share one operation id
    for path, probe in (("/health", health), ("/health/{engine}", replica_health)):
        app.add_api_route(path, probe, methods=["HEAD"], include_in_schema=False)

    # what the probes leave out: each replica's answer (200 while every pool has a live
    # replica, else 503)
    @app.get("/cluster/replicas")
    async def replicas() -> Response:
        answers, down = await _answers(cluster)
        body = {"status": "ok" if not down else "degraded", "replicas": answers}
        if down:
            body["pools_without_live_replica"] = down
        return JSONResponse(body, status_code=200 if not down else 503)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        live = live_replicas(cluster)

        async def text_of(pool: str, engine: int) -> tuple[int, str, str] | None:
            try:
                return engine, pool, await call_replica(cluster, pool, engine, "metrics_text")
            except Exception as e:
                log.warning("metrics of replica %d (%s): %s", engine, pool, e)
                return None

        texts = [t for t in await asyncio.gather(*(text_of(p, e) for p, e in live)) if t]
        counts = "\n".join(f'stepserve:cluster_replicas_live{{pool="{p}"}} '
                           f"{sum(1 for q, _ in live if q == p)}" for p in cluster.handles)
        head = ("# HELP stepserve:cluster_replicas_live replicas the ingress routes to\n"
                "# TYPE stepserve:cluster_replicas_live gauge\n")
        return Response(f"{merge_metrics(texts)}{head}{counts}\n",
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def live_replicas(cluster: ClusterEngine) -> list[tuple[str, int]]:
    """(pool, engine index) of every replica the routers see, by engine index."""
    out = [(pool, st.engine) for pool in cluster.handles if (router := ROUTERS.get(pool))
           for st in router.replica_stats()]
    return sorted(out, key=lambda p: p[1])


async def call_replica(cluster: ClusterEngine, pool: str, engine: int, method: str):
    handle = getattr(cluster.handles[pool], method)
    response = handle.remote(target=engine)
    try:
        return await asyncio.wait_for(response, REPLICA_CALL_TIMEOUT_S)
    except BaseException:
        response.cancel()
        raise


async def _health_of(cluster: ClusterEngine, pool: str, engine: int) -> dict:
    try:
        return await call_replica(cluster, pool, engine, "health")
    except Exception as e:
        return {"engine": engine, "pool": pool, "status": "unreachable", "error": brief(e)}


async def _answers(cluster: ClusterEngine) -> tuple[list[dict], list[str]]:
    """Every live replica's own health answer, and the pools none of them serves."""
    replicas = live_replicas(cluster)
    answers = await asyncio.gather(*(_health_of(cluster, p, e) for p, e in replicas))
    up = {a["pool"] for a in answers if a.get("status") == "ok"}
    return list(answers), [p for p in cluster.handles if p not in up]


def _unhealthy(reason: str, code: str) -> Response:
    return APIError(503, reason, UNAVAILABLE, code=code).response()
