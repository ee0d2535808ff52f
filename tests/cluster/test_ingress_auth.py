"""`serve --replicas N --api-key K`: the ingress asks for the key as the single-process
server does (401 in OpenAI's shape; /health, /metrics and /version open; /metrics
behind the key with --metrics-require-api-key), and each
replica's detail (/cluster/replicas) is behind it. Runs without Ray: the ingress app over
a stand-in for the cluster."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")
from fastapi.testclient import TestClient  # noqa: E402

from stepserve.cluster.app import IngressSettings, create_ingress_app  # noqa: E402


class NoCluster:
    """What the ingress app's lifespan and health routes touch, and nothing else."""

    handles: dict = {}  # no pools: nothing to ask a replica
    accepting = True

    async def drain(self, timeout_s: float) -> None:
        return None

    async def stop(self) -> None:
        return None


def test_the_ingress_checks_the_api_key():
    settings = IngressSettings("tiny", 256, 512, 4096, api_keys=("secret",))
    with TestClient(create_ingress_app(NoCluster(), settings)) as client:
        refused = client.post("/v1/completions", json={"prompt": "hi"})
        assert refused.status_code == 401
        assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
        wrong = client.get("/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Bearer secret"}
                          ).status_code == 200
        assert client.get("/version").status_code != 401


def test_each_replicas_detail_needs_the_key_and_the_probe_does_not():
    settings = IngressSettings("tiny", 256, 512, 4096, api_keys=("secret",))
    with TestClient(create_ingress_app(NoCluster(), settings)) as client:
        assert client.get("/cluster/replicas").status_code == 401
        detail = client.get("/cluster/replicas", headers={"Authorization": "Bearer secret"})
        assert detail.status_code == 200 and detail.json()["replicas"] == []
        assert client.get("/health").json() == {"status": "ok"}
        assert client.head("/health").status_code == 200


def test_the_ingress_metrics_need_the_key_when_asked():
    settings = IngressSettings("tiny", 256, 512, 4096, api_keys=("secret",),
                               metrics_require_api_key=True)
    with TestClient(create_ingress_app(NoCluster(), settings)) as client:
        refused = client.get("/metrics")
        assert refused.status_code == 401
        assert refused.json() == client.get("/v1/models").json()
        assert client.get("/metrics", headers={"Authorization": "Bearer nope"}
                          ).status_code == 401
        ok = client.get("/metrics", headers={"Authorization": "Bearer secret"})
        assert ok.status_code == 200 and "stepserve:cluster_replicas_live" in ok.text
        assert client.get("/health").status_code == 200


def test_the_ingress_metrics_stay_open_without_the_flag():
    settings = IngressSettings("tiny", 256, 512, 4096, api_keys=("secret",))
    with TestClient(create_ingress_app(NoCluster(), settings)) as client:
        assert client.get("/metrics").status_code == 200


def test_guarding_the_ingress_metrics_needs_a_key():
    with pytest.raises(ValueError, match="metrics_require_api_key needs api_keys"):
        IngressSettings("tiny", 256, 512, 4096, metrics_require_api_key=True)
