"""`--api-key`: every route needs `Authorization: Bearer KEY` except the public ones, as
in vLLM (probes, /metrics and the docs stay open); a missing or wrong key gets 401 in
OpenAI's error shape. Keys are compared as SHA-256 digests with `compare_digest`, so an
answer's timing says nothing about how much of a guess was right.

`metrics_require_api_key` (`serve --metrics-require-api-key`) takes /metrics out of the
public paths: it shows load figures (queue depths, KV usage, the prefix cache's hit and
query totals) an operator may not want open, and the same one check then guards it.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from typing import Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from stepserve.server.errors import APIError

METRICS_PATH = "/metrics"
PUBLIC_PATHS = ("/health", "/ping", "/load", "/version", METRICS_PATH, "/docs", "/redoc",
                "/openapi.json")


def check_key_settings(keys: Sequence[str], metrics_require_api_key: bool) -> None:
    """ValueError for /metrics guarded without a key to guard it with."""
    if metrics_require_api_key and not keys:
        raise ValueError("metrics_require_api_key needs api_keys: without a key /metrics "
                         "would stay open")


def add_api_key_auth(app: Any, keys: Sequence[str], metrics_require_api_key: bool) -> None:
    """`app` (a Starlette app) behind the key check when there are keys."""
    check_key_settings(keys, metrics_require_api_key)
    if keys:
        app.add_middleware(ApiKeyAuth, keys=list(keys),
                           metrics_require_api_key=metrics_require_api_key)


class ApiKeyAuth:
    """Pure ASGI middleware: checks the bearer token of every non-public HTTP request."""

    def __init__(self, app: ASGIApp, keys: Sequence[str], *,
                 metrics_require_api_key: bool = False) -> None:
        if not keys or not all(keys):
            raise ValueError("api keys must be non-empty strings")
        self.app = app
        self._public = tuple(p for p in PUBLIC_PATHS
                             if not (metrics_require_api_key and p == METRICS_PATH))
        self._digests = [hashlib.sha256(k.encode()).digest() for k in keys]

    def authorized(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(token.strip().encode()).digest()
        ok = False
        for known in self._digests:  # every key compared: no early exit to time
            ok |= secrets.compare_digest(digest, known)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")  # public: a public path or below (not /healthz)
        if scope["type"] != "http" or scope.get("method") == "OPTIONS" \
                or any(path == p or path.startswith(p + "/") for p in self._public) \
                or self.authorized(Headers(scope=scope)):
            await self.app(scope, receive, send)
            return
        given = "authorization" in Headers(scope=scope)
        message = ("Incorrect API key provided" if given else
                   "Missing API key: send `Authorization: Bearer <key>`")
        response = APIError(401, message, "authentication_error", code="invalid_api_key",
                            headers={"WWW-Authenticate": "Bearer"}).response()
        await response(scope, receive, send)
