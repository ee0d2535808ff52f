"""`serve --metrics-require-api-key`: /metrics behind the same key check as /v1 (the same
401 for a missing or wrong key), while without the flag it stays open as in vLLM; the
flag without a key to require is a CLI mistake."""

from __future__ import annotations

import httpx
import pytest
from server_harness import serve

KEY = "sesame"


def test_metrics_needs_the_key_when_asked_and_refuses_as_v1_does():
    with serve(api_keys=[KEY], metrics_require_api_key=True) as s:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            refused = httpx.get(s.url + "/metrics", headers=headers)
            as_v1 = httpx.get(s.base_url + "/models", headers=headers)
            assert refused.status_code == 401 == as_v1.status_code, headers
            assert refused.json() == as_v1.json(), headers
            assert refused.json()["error"]["code"] == "invalid_api_key"
            assert refused.headers["www-authenticate"] == "Bearer"
            assert "prefix_cache" not in refused.text
        ok = httpx.get(s.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200
        assert ok.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "\nstepserve:prefix_cache_hits_total{" in ok.text
        for path in ("/health", "/version"):  # the probes stay open
            assert httpx.get(s.url + path).status_code == 200, path


def test_without_the_flag_metrics_stays_open_behind_an_api_key():
    with serve(api_keys=[KEY]) as s:
        assert httpx.get(s.base_url + "/models").status_code == 401
        assert httpx.get(s.url + "/metrics").status_code == 200


def test_the_app_refuses_to_guard_metrics_without_a_key():
    from stepserve.server.api import create_app

    with pytest.raises(ValueError, match="metrics_require_api_key needs api_keys"):
        create_app(lambda: None, metrics_require_api_key=True)


def test_the_flag_without_a_key_is_one_error_line(capsys, monkeypatch):
    from stepserve.cli import main, serve

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setattr(serve, "run_serve", lambda options: pytest.fail("ran"))
    assert main(["serve", "--model", "tiny", "--metrics-require-api-key"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "--metrics-require-api-key" in err and "--api-key" in err, err
    assert "VLLM_API_KEY" in err, err


@pytest.mark.parametrize("how", ["flag", "environment", "config file"])
def test_the_flag_reaches_the_server_with_a_key(how, tmp_path, monkeypatch):
    from stepserve.cli import main, serve

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    seen = []
    monkeypatch.setattr(serve, "run_serve", lambda options: seen.append(options) or 0)
    flags = ["--metrics-require-api-key", "--api-key", KEY]
    if how == "environment":
        monkeypatch.setenv("VLLM_API_KEY", KEY)
        flags = ["--metrics-require-api-key"]
    elif how == "config file":  # vLLM-style: a flat key is the flag of that name
        path = tmp_path / "serve.yaml"
        path.write_text(f"metrics-require-api-key: true\napi-key: {KEY}\n")
        flags = ["--config", str(path)]
    assert main(["serve", "--model", "tiny", *flags]) == 0
    assert seen[0].metrics_require_api_key and seen[0].api_keys == (KEY,)


def test_the_flag_reaches_the_cluster_ingress(monkeypatch):
    from stepserve.cli import main
    from stepserve.cluster import job

    seen = []
    monkeypatch.setattr(job, "run_cluster_serve", lambda options: seen.append(options) or 0)
    assert main(["serve", "--model", "tiny", "--replicas", "2", "--port", "0",
                 "--api-key", KEY, "--metrics-require-api-key"]) == 0
    assert seen[0].metrics_require_api_key and seen[0].api_keys == (KEY,)
