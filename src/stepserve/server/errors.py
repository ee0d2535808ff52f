"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Every failure the server reports, a client's mistake or its own, leaves through `APIError`
so the status, the type and the body always agree. A client's mistake is a 4xx naming the
field; only a fault of the server itself is a 5xx.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from starlette.responses import JSONResponse

from stepserve.core.end_reasons import (
    INVALID_REQUEST,
    NOT_FOUND,
    RATE_LIMIT,
    SERVER_ERROR,
    UNAVAILABLE,
    EndReason,
)

__all__ = ["INVALID_REQUEST", "NOT_FOUND", "RATE_LIMIT", "SERVER_ERROR", "UNAVAILABLE",
           "APIError", "bad_request", "from_validation_error"]


class APIError(Exception):
    """An error answer: HTTP status, OpenAI error type, the offending parameter, a code."""

    def __init__(self, status: int, message: str, type: str = INVALID_REQUEST,
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    @classmethod
    def of(cls, end: EndReason, detail: str, param: str | None = None,
           headers: dict[str, str] | None = None) -> APIError:
        """The error answer of a request that ended or was refused so (end_reasons.py's
        row: status, type, code, message), `detail` saying what happened to this one."""
        assert end.error_type is not None, f"{end.key.value} is no error"
        return cls(end.http_status, end.describe(detail), end.error_type, param,
                   end.error_code, headers)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    def sse_event(self) -> str:
        """The error as a server-sent event, for failures after the stream began."""
        return f"data: {json.dumps(self.body())}\n\n"


def bad_request(message: str, param: str | None = None,
                code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, INVALID_REQUEST, param, code)


def _loc(loc: tuple[Any, ...]) -> str | None:
    """pydantic's location as OpenAI's dotted param ("messages.0.role"); union branch
    names (the type pydantic tried, e.g. "str" or "list[int]") are dropped."""
    parts = [str(p) for p in loc]
    return ".".join(p for p in parts if p.isdigit() or not (
        any(c in p for c in "[]()-") or p in ("str", "int", "float", "bool", "literal"))) or None


def from_validation_error(err: ValidationError) -> APIError:
    """The first problem pydantic found, as a 400 naming the field and the value."""
    first = err.errors(include_url=False)[0]
    param = _loc(first.get("loc", ()))
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        return bad_request(f"unknown field {param!r}: this server does not accept it",
                           param, "unknown_field")
    if kind == "missing":
        return bad_request(f"missing required field {param!r}", param, "missing_field")
    if kind == "model_type":
        got = type(first.get("input")).__name__
        got = {"list": "an array", "str": "a string", "int": "a number", "float": "a number",
               "bool": "a boolean", "NoneType": "null"}.get(got, got)
        return bad_request(f"{param or 'the request body'} must be a JSON object, got {got}",
                           param, "invalid_type")
    if kind == "json_invalid":
        return bad_request(f"the body is not valid JSON: {first.get('msg')}", None,
                           "invalid_json")
    value = first.get("input")
    try:
        shown = json.dumps(value)[:80]
    except (TypeError, ValueError):
        shown = repr(value)[:80]
    where = f"{param} = {shown}: " if param else "the request body: "
    return bad_request(f"{where}{first.get('msg', 'invalid value')}", param,
                       "invalid_type" if kind.endswith("_type") else "invalid_value")

