"""`HEAD /health` answers as `GET /health` does, without a body: probes (load balancers,
Kubernetes httpGet, vLLM's clients) use either."""

from __future__ import annotations

import httpx


def test_head_health_is_get_health_without_a_body(served):
    get = httpx.get(served.url + "/health")
    head = httpx.head(served.url + "/health")
    assert (head.status_code, get.status_code) == (200, 200)
    assert head.content == b"" and get.json()["status"] == "ok"
    assert head.headers["content-type"] == get.headers["content-type"]
