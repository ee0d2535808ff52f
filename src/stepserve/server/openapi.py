"""The OpenAPI document: the POST endpoints read their bodies by hand (body.py), so
FastAPI cannot see their models; this adds them, with every bound and every status the
endpoints can answer, for schema-driven clients and fuzzers (schemathesis).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from stepserve.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)

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

GENERATION_ROUTES = {
    "/v1/completions": ((CompletionRequest,), CompletionResponse),
    "/v1/chat/completions": ((ChatCompletionRequest,), ChatCompletionResponse),
}
BODY_ROUTES = {
    "/tokenize": ((TokenizeCompletionRequest, TokenizeChatRequest), TokenizeResponse),
    "/detokenize": ((DetokenizeRequest,), DetokenizeResponse),
}


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
    """Replace `app.openapi` with one that documents the generation endpoints (and, once
    the app has started, the served model's name and limits)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        ctx = getattr(app.state, "ctx", None)  # None before the app started
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = doc.setdefault("components", {}).setdefault("schemas", {})
        error = _add_schema(components, ErrorResponse, "serialization")
        errors = {code: _json(error, why) for code, why in ERROR_STATUSES.items()}
        for path, (request_models, response_model) in {**GENERATION_ROUTES,
                                                       **BODY_ROUTES}.items():
            bodies = [_add_schema(components, m) for m in request_models]
            body = bodies[0] if len(bodies) == 1 else {"anyOf": bodies}
            answer = _add_schema(components, response_model, "serialization")
            if path in GENERATION_ROUTES:
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
