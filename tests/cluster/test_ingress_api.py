"""The ingress app's own routes, without Ray: the ingress over a ClusterEngine with no
pools (nothing here reaches a replica), next to the single-process server over the tiny
model.

* /tokenize, /detokenize and /version answer as the single server does, errors included;
* bodies the parser must refuse (a lone surrogate, an integer of 5,000 digits) are a 400
  in OpenAI's error shape, not a 500;
* HEAD /health answers as GET does; the public /health says only "ok", or 503 with a
  short reason (the replicas' detail is /cluster/replicas);
* /openapi.json is served.
"""

from __future__ import annotations

import warnings

import pytest

from stepserve.server.errors import APIError

pytest.importorskip("ray")
from fastapi.testclient import TestClient  # noqa: E402

from stepserve.cluster.app import IngressSettings, create_ingress_app  # noqa: E402
from stepserve.cluster.frontend import ClusterEngine  # noqa: E402
from stepserve.config.settings import EngineConfig  # noqa: E402
from stepserve.model.presets import resolve_model  # noqa: E402
from stepserve.model.tokenizer import Tokenizer  # noqa: E402
from stepserve.routing.pools import Deployment  # noqa: E402

MODEL = "tiny"
BASE = EngineConfig().replace(num_gpu_blocks=128, max_model_len=256, max_num_seqs=8)
PROMPT = "The quick brown fox"
CHAT = [{"role": "user", "content": "Name a capital city."}]

# raw bodies json.loads takes: a str no tokenizer can encode (a lone surrogate) and an
# int too long for int(); each used to end in a 500
LONE_SURROGATE = b'{"model": "tiny", "prompt": "ab\\ud800cd", "max_tokens": 4}'
CHAT_SURROGATE = (b'{"model": "tiny", "max_tokens": 4, "messages": '
                  b'[{"role": "user", "content": "ab\\ud800cd"}]}')
HUGE_INTEGER = b'{"model": "tiny", "prompt": "ab", "max_tokens": ' + b"9" * 5000 + b"}"


@pytest.fixture(scope="module")
def single():
    from stepserve.engine.llm_engine import LLMEngine
    from stepserve.server.api import create_app

    app = create_app(LLMEngine(MODEL, BASE), model_name=MODEL)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module")
def ingress(single):
    tokenizer = Tokenizer(str(resolve_model(MODEL)))
    vocab_size = single.app.state.ctx.vocab_size
    settings = IngressSettings(MODEL, BASE.scheduler.max_model_len, vocab_size,
                               BASE.scheduler.max_model_len * tokenizer.max_token_bytes())
    cluster = ClusterEngine(Deployment.single(BASE), {})
    app = create_ingress_app(cluster, settings, tokenizer)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def answer(client: TestClient, method: str, path: str, body: dict | None = None):
    r = client.request(method, path, json=body)
    return r.status_code, r.json()


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/tokenize", {"model": MODEL, "prompt": PROMPT, "return_token_strs": True}),
    ("POST", "/tokenize", {"prompt": PROMPT, "add_special_tokens": False}),
    ("POST", "/tokenize", {"messages": CHAT}),
    ("POST", "/tokenize", {"messages": CHAT, "add_generation_prompt": False}),
    ("POST", "/tokenize", {"model": "other", "prompt": "a"}),
    ("POST", "/tokenize", {"prompt": 5}),
    ("POST", "/detokenize", {"tokens": [10, 20, 30]}),
    ("POST", "/detokenize", {"tokens": [10**6]}),
    ("GET", "/version", None),
])
def test_utility_routes_answer_as_the_single_server(single, ingress, method, path, body):
    status, got = answer(ingress, method, path, body)
    assert status != 404 or got["error"]["code"] == "model_not_found", got
    assert (status, got) == answer(single, method, path, body)


def test_tokenize_through_the_ingress_uses_the_model_tokenizer(ingress):
    status, got = answer(ingress, "POST", "/tokenize", {"prompt": PROMPT})
    tokenizer = ingress.app.state.ctx.tokenizer
    assert status == 200 and got["tokens"] == tokenizer.encode(PROMPT)
    back = answer(ingress, "POST", "/detokenize", {"tokens": got["tokens"]})
    assert back == (200, {"prompt": PROMPT})


@pytest.mark.parametrize("path, raw", [
    ("/v1/completions", LONE_SURROGATE),
    ("/v1/completions", HUGE_INTEGER),
    ("/v1/chat/completions", CHAT_SURROGATE),
    ("/tokenize", LONE_SURROGATE),
], ids=["surrogate", "huge-integer", "chat-surrogate", "tokenize-surrogate"])
def test_bodies_the_parser_refuses_are_a_400(ingress, path, raw):
    r = ingress.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_public_health_is_only_the_status_and_answers_head(ingress):
    got = ingress.get("/health")
    assert (got.status_code, got.json()) == (200, {"status": "ok"})
    head = ingress.head("/health")
    assert head.status_code == 200 and head.content == b""


def test_openapi_document_is_served(ingress):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. two routes with one operation id
        r = ingress.get("/openapi.json")
    assert r.status_code == 200 and "/tokenize" in r.json()["paths"]


def test_a_pool_without_a_live_replica_is_a_short_503():
    cluster = ClusterEngine(Deployment.single(BASE), {"spare": None})
    settings = IngressSettings(MODEL, 256, 512, 4096)
    with TestClient(create_ingress_app(cluster, settings)) as client:
        probe = client.get("/health")
        assert probe.status_code == 503 and probe.json()["error"] == {
            "message": "no live replica in pool(s): spare", "type":
            "service_unavailable_error", "param": None, "code": "no_live_replica"}
        assert client.head("/health").status_code == 503
        detail = client.get("/cluster/replicas")
        assert detail.status_code == 503
        assert detail.json()["pools_without_live_replica"] == ["spare"]


def test_a_valid_body_passes_the_request_checks_to_the_pools(ingress, monkeypatch):
    # Every check a request body goes through at the ingress runs on its tokenizer and
    # limits (no runner): a valid body with stop_token_ids reaches ClusterEngine.add with
    # its parameters, instead of failing in the checks (a 500).
    reached = []

    async def add(self, request):
        reached.append(request.params)
        raise APIError(503, "reached the pools", "service_unavailable_error", code="test")

    monkeypatch.setattr(ClusterEngine, "add", add)
    body = {"model": "tiny", "prompt": "ab", "max_tokens": 4, "stop_token_ids": [5],
            "min_tokens": 1}
    r = ingress.post("/v1/completions", json=body)
    assert r.status_code == 503, r.text[:300]
    assert [tuple(p.stop_token_ids) for p in reached] == [(5,)]
