"""The FastAPI app: OpenAI-compatible routes, vLLM's /tokenize, /detokenize and /version
(the same body limits as generation, a text or id list bounded like a prompt), /health,
/metrics, error handlers that answer every failure in OpenAI's error shape, and the
OpenAPI document of the bodies the POST routes read by hand."""

from __future__ import annotations

import gc
import inspect
import logging
from collections.abc import Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from stepserve import __version__
from stepserve.core.end_reasons import Refusal, end_reason, refusal_of_error
from stepserve.core.request_limits import DEFAULT_MAX_REQUEST_BYTES
from stepserve.model.generation_config import SamplingDefaults
from stepserve.server.async_engine import AsyncEngine
from stepserve.server.auth import add_api_key_auth
from stepserve.server.body import parse_body, read_json, validate
from stepserve.server.errors import (
    INVALID_REQUEST,
    NOT_FOUND,
    SERVER_ERROR,
    APIError,
    bad_request,
)
from stepserve.server.fingerprint import system_fingerprint
from stepserve.server.metrics import ServerMetrics
from stepserve.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    HealthStatus,
    ModelCard,
    ModelList,
    ModelPermission,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
    VersionResponse,
)
from stepserve.server.serving import (
    ServingContext,
    chat_prompt,
    check_model,
    check_text_size,
    check_token_count,
    create_chat_completion,
    create_completion,
)

log = logging.getLogger("stepserve.server")


def create_app(engine, *, model_name: str | Sequence[str] | None = None,
               retry_after_s: int = 1,
               shutdown_timeout_s: float = 30.0,
               max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
               api_keys: Sequence[str] = (),
               metrics_require_api_key: bool = False,
               vllm_metric_names: bool = True,
               sampling_defaults: SamplingDefaults | None = None,
               enable_prompt_tokens_details: bool = False,
               fingerprint_mode: str = "full",
               fingerprint_value: str | None = None) -> FastAPI:
    """`engine`: an LLMEngine, or a zero-argument callable returning one (built when the
    app starts). `model_name`: what clients pass as `model`, or several names (the
    first is the one answers and metrics carry; default: the model directory's name).
    `api_keys`: when given, the non-public routes need one (auth.py);
    `metrics_require_api_key`: /metrics too (it needs `api_keys`); `vllm_metric_names`:
    /metrics carries vLLM's names too (server/vllm_metrics.py);
    `sampling_defaults`: for the fields a request leaves out (--generation-config;
    default: vLLM's own); `enable_prompt_tokens_details`: usage carries them (vLLM's
    flag); `fingerprint_mode`/`fingerprint_value`: the answers' system_fingerprint
    (vLLM's --fingerprint-mode, fingerprint.py).
    If the engine loop dies, /health answers 503 and the app calls
    `app.state.request_exit()` (http_server.py) so the process exits non-zero."""

    system_fingerprint(None, "", fingerprint_mode, fingerprint_value)  # a bad mode: now

    def on_fatal(reason: str) -> None:  # engine thread, after every request was answered
        log.critical("%s; the server exits", reason)
        request_exit = getattr(app.state, "request_exit", None)
        if request_exit is not None:
            request_exit()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        llm_engine = engine() if callable(engine) and not hasattr(engine, "step") else engine
        names = (model_name,) if isinstance(model_name, str) else tuple(model_name or ())
        name = names[0] if names else llm_engine.runner.model_path.name
        app.state.metrics = metrics = ServerMetrics(name, llm_engine.config.scheduler,
                                                    vllm_names=vllm_metric_names)
        app.state.async_engine = async_engine = AsyncEngine(llm_engine, metrics, on_fatal)
        async_engine.start()
        max_len = llm_engine.config.scheduler.max_model_len
        tokenizer = llm_engine.tokenizer
        app.state.ctx = ServingContext(
            async_engine, tokenizer, llm_engine.clock, name, max_len,
            llm_engine.runner.args.vocab_size, retry_after_s, max_request_bytes,
            max_len * tokenizer.max_token_bytes(), str(llm_engine.runner.model_path),
            tuple(n for n in names[1:] if n != name),
            sampling_defaults=sampling_defaults or SamplingDefaults(),
            enable_prompt_tokens_details=enable_prompt_tokens_details,
            system_fingerprint=system_fingerprint(
                llm_engine.config, str(llm_engine.runner.model_path), fingerprint_mode,
                fingerprint_value))
        app.state.shutdown_timeout_s = shutdown_timeout_s
        # Everything loaded so far (torch, the model, the tokenizer) lives as long as the
        # server: take it out of the cyclic GC's reach, or every full collection walks it
        # (0.18 s on the event loop, seen after one allocation-heavy request body).
        gc.collect()
        gc.freeze()
        log.info("serving %s (max_model_len %d)", name, max_len)
        try:
            yield
        finally:  # in-flight requests finish (or are aborted), then the engine thread ends
            finished, aborted = await async_engine.drain(shutdown_timeout_s)
            if finished or aborted:
                log.info("shutdown: %d in-flight requests finished, %d aborted", finished,
                         aborted)
            await async_engine.stop()
            app.state.ctx.workers.shutdown(wait=False)

    app = FastAPI(title="stepserve", version="0.1.0", lifespan=lifespan)
    add_error_handlers(app)
    install_openapi(app)
    install_tokenize_routes(app)
    add_api_key_auth(app, api_keys, metrics_require_api_key)
    add_openai_routes(app)
    _add_health_and_metrics_routes(app)
    return app


def _post(app: FastAPI, path: str) -> None:
    name, handler = POST_ROUTES[path][:2]

    async def endpoint(request: Request) -> Response:
        return await handler(request.app.state.ctx, request)

    app.add_api_route(path, endpoint, methods=["POST"], name=name,
                      description=inspect.cleandoc(handler.__doc__ or ""))


def add_openai_routes(app: FastAPI) -> None:
    """/v1/completions, /v1/chat/completions and /v1/models over `app.state.ctx` (the
    ServingContext its lifespan sets: one engine's, or the cluster ingress's)."""
    for path in STREAMED:
        _post(app, path)

    @app.get("/v1/models", response_model=ModelList)
    async def models(request: Request) -> dict:
        ctx: ServingContext = request.app.state.ctx
        return ModelList(data=[
            ModelCard(id=name, root=ctx.model_root, max_model_len=ctx.max_model_len,
                      permission=[ModelPermission()])
            for name in (ctx.model_name, *ctx.model_aliases)]).model_dump()


def _add_health_and_metrics_routes(app: FastAPI) -> None:
    """/health (503 with the reason when the engine is down or shutting down) and
    /metrics of the one engine."""

    @app.get("/health", response_model=HealthStatus,
             responses={503: {"model": ErrorResponse,
                              "description": "engine down (with the reason) or "
                                             "shutting down"}})
    async def health(request: Request) -> Response:
        eng: AsyncEngine = request.app.state.async_engine
        if not eng.is_running:
            return _unhealthy(Refusal.ENGINE_DOWN, eng.fault or "the engine is not running")
        if not eng.accepting:
            return _unhealthy(Refusal.SHUTTING_DOWN, "the server is shutting down")
        s = eng.state
        return JSONResponse({"status": "ok", "num_requests_running": s.num_running,
                             "num_requests_waiting": s.num_waiting, "steps": s.steps})

    # HEAD too, as probes (and vLLM's /health) use it: the same status, no body. A route
    # of its own, outside the schema: one route for both methods gives both operations
    # the same operationId.
    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)

    @app.get("/metrics", response_class=PlainTextResponse,
             responses={200: {"description": "Prometheus text format"}})
    async def metrics(request: Request) -> Response:
        return Response(request.app.state.metrics.render(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")


def _unhealthy(why: Refusal, message: str) -> Response:
    """/health's 503: the status, type and code a request refused so gets."""
    end = end_reason(why)
    assert end.error_type is not None
    return APIError(end.http_status, message, end.error_type,
                    code=end.error_code).response()


def _count_rejection(request: Request, err: APIError) -> None:
    refusal = refusal_of_error(err.status, err.code)
    metrics = getattr(request.app.state, "metrics", None)
    if refusal is not None and metrics is not None:
        metrics.on_rejected(refusal.key.value)


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> Response:
        _count_rejection(request, exc)
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        kind = NOT_FOUND if exc.status_code == 404 else \
            INVALID_REQUEST if exc.status_code < 500 else SERVER_ERROR
        err = APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                       kind, code=str(exc.detail).lower().replace(" ", "_"),
                       headers=dict(exc.headers or {}))
        return err.response()

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, exc: ClientDisconnect) -> Response:
        # the client left (or its connection was cut: a stalled body gets its 408 from
        # connection_limits.py) before its body arrived: nothing to answer, nothing to log
        log.debug("%s %s: the client went away before its body arrived", request.method,
                  request.url.path)
        return Response(status_code=499)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        err = bad_request(str(first.get("msg", "invalid request")),
                          ".".join(str(p) for p in first.get("loc", ())[1:]) or None)
        _count_rejection(request, err)
        return err.response()

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return APIError(500, f"internal server error: {type(exc).__name__}: {exc}",
                        SERVER_ERROR, code="internal_error").response()


async def tokenize(ctx: ServingContext, request: Request) -> Response:
    """vLLM's /tokenize: `prompt` (text), or `messages` rendered by the chat
    template; `{count, max_model_len, tokens, token_strs}`."""
    tok = ctx.tokenizer
    data = await read_json(ctx, request)
    chat = isinstance(data, dict) and "messages" in data
    body = validate(data, TokenizeChatRequest if chat else TokenizeCompletionRequest)
    check_model(ctx, body.model)
    if isinstance(body, TokenizeChatRequest):
        ids, param = await chat_prompt(ctx, body, body.add_generation_prompt), "messages"
    else:
        check_text_size(ctx, len(body.prompt), "prompt")
        ids = await ctx.off_loop(tok.encode, body.prompt, body.add_special_tokens)
        param = "prompt"
    check_token_count(ctx, len(ids), param)
    strs = await ctx.off_loop(lambda: [tok.id_to_token(i) or "" for i in ids]) \
        if body.return_token_strs else None
    return JSONResponse({"count": len(ids), "max_model_len": ctx.max_model_len,
                         "tokens": ids, "token_strs": strs})


async def detokenize(ctx: ServingContext, request: Request) -> Response:
    """vLLM's /detokenize: `tokens` to `{prompt}`."""
    body = await parse_body(ctx, request, DetokenizeRequest)
    check_model(ctx, body.model)
    check_token_count(ctx, len(body.tokens), "tokens")
    bad = [t for t in body.tokens if t >= ctx.vocab_size]
    if bad:
        raise bad_request(f"tokens must be in [0, {ctx.vocab_size}); got {bad[:5]}",
                          "tokens")
    text = await ctx.off_loop(ctx.tokenizer.decode, body.tokens)
    return JSONResponse({"prompt": text})


# POST path -> (its operation's name, handler(ctx, request), the request bodies it takes,
# its answer). The handlers read their bodies by hand (size limit, bounded parsing:
# body.py), so FastAPI cannot see the models: install_openapi documents them from here.
POST_ROUTES = {
    "/v1/completions": ("completions", create_completion, (CompletionRequest,),
                        CompletionResponse),
    "/v1/chat/completions": ("chat_completions", create_chat_completion,
                             (ChatCompletionRequest,), ChatCompletionResponse),
    "/tokenize": ("tokenize", tokenize, (TokenizeCompletionRequest, TokenizeChatRequest),
                  TokenizeResponse),
    "/detokenize": ("detokenize", detokenize, (DetokenizeRequest,), DetokenizeResponse),
}
STREAMED = ("/v1/completions", "/v1/chat/completions")  # answered as SSE with stream: true


def install_tokenize_routes(app: FastAPI) -> None:
    for path in ("/tokenize", "/detokenize"):
        _post(app, path)

    @app.get("/version", response_model=VersionResponse)
    async def version() -> dict:
        return {"version": __version__}


REF = "#/components/schemas/{model}"

# status -> why, for both generation endpoints
ERROR_STATUSES = {
    "400": "invalid request (the message names the field and what is allowed)",
    "404": "unknown model",
    "413": "request body over --max-request-bytes",
    "415": "Content-Type is not application/json",
    "429": "queue full (max_waiting): retry after Retry-After seconds",
    "500": "a fault of the server while running this request",
    "503": "shutting down, engine down, queue timeout, or aborted",
}

# One server-sent event (OpenAPI < 3.2: the stream's `schema` describes each event). Its
# data is a JSON chunk (the response's chunk model, or an error), then "[DONE]".
SSE_EVENT = {"type": "object", "required": ["data"],
             "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}


def _add_schema(components: dict[str, Any], model: type[BaseModel],
                mode: str = "validation") -> dict[str, str]:
    schema = model.model_json_schema(ref_template=REF, mode=mode)  # type: ignore[arg-type]
    components.update(schema.pop("$defs", {}))
    components[model.__name__] = schema
    return {"$ref": REF.format(model=model.__name__)}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _walk(schema: Any):
    """Every sub-schema (dicts) of `schema`, depth first."""
    if isinstance(schema, dict):
        yield schema
        for value in schema.values():
            yield from _walk(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _walk(value)


def _served_limits(components: dict[str, Any], model_name: str, max_model_len: int,
                   vocab_size: int) -> None:
    """State the served model's own limits: its name, its vocabulary (token ids), its
    context (no output longer than max_model_len - 1 after a one-token prompt)."""
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        props = components[name]["properties"]
        props["model"] = {"type": "string", "enum": [model_name], "title": "Model"}
        for field in ("max_tokens", "max_completion_tokens"):
            for sub in _walk(props.get(field)):
                if sub.get("type") == "integer":
                    sub["maximum"] = max_model_len - 1
    for sub in _walk(components["CompletionRequest"]["properties"]["prompt"]):
        if sub.get("type") == "integer":
            sub["maximum"] = vocab_size - 1


def install_openapi(app: FastAPI) -> None:
    """Replace `app.openapi` with one that documents the POST endpoints' bodies, every
    status they can answer (and, once the app has started, the served model's name and
    limits), for schema-driven clients and fuzzers (schemathesis)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        ctx = getattr(app.state, "ctx", None)  # None before the app started
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = doc.setdefault("components", {}).setdefault("schemas", {})
        error = _add_schema(components, ErrorResponse, "serialization")
        errors = {code: _json(error, why) for code, why in ERROR_STATUSES.items()}
        for path, (_, _, request_models, response_model) in POST_ROUTES.items():
            bodies = [_add_schema(components, m) for m in request_models]
            body = bodies[0] if len(bodies) == 1 else {"anyOf": bodies}
            answer = _add_schema(components, response_model, "serialization")
            if path in STREAMED:
                ok = _json(answer, "the completion (stream: false)")
                ok["content"]["text/event-stream"] = {"schema": SSE_EVENT}
            else:
                ok = _json(answer, "the answer")
            operation = doc["paths"][path]["post"]
            operation["requestBody"] = {"required": True,
                                        "content": {"application/json": {"schema": body}}}
            operation["responses"] = {"200": ok, **errors}
        if ctx is None:
            return doc  # not cached: the served model's limits are not known yet
        _served_limits(components, ctx.model_name, ctx.max_model_len, ctx.vocab_size)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
