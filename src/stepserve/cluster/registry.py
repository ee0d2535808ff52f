"""The request routers alive in this process (the ingress's), by pool, so the ingress can
list the live replicas for /health and /metrics.

It lives in a module of its own, looked up when used: Ray Serve ships the router class
to the handle by value (cloudpickle), and a by-value class's methods get copies of the
module globals they name, so a registry named as a global there would be a copy."""

from __future__ import annotations

from typing import Any

ROUTERS: dict[str, Any] = {}  # pool name -> StepserveRequestRouter
