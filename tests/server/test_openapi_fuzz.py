"""schemathesis against /openapi.json: requests generated from the published schema, valid
and invalid, get no 5xx, and every answer (status, content type, body) is one the schema
documents; invalid ones are refused.

Not checked: schemathesis' "schema-valid request accepted" heuristic. The API has limits a
static schema cannot state (prompt + max_tokens within max_model_len, token ids within
the vocabulary, an empty prompt), refused with a 400 that names them.

CI runs a fixed (derandomized) set of EXAMPLES per operation and mode; for a longer
random hunt: STEPSERVE_FUZZ_RANDOM=1 STEPSERVE_FUZZ_EXAMPLES=400 (1,600 requests, no
failure found here).
"""

from __future__ import annotations

import collections
import os

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES = int(os.environ.get("STEPSERVE_FUZZ_EXAMPLES", 40))  # per operation and mode
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]


def test_openapi_documents_the_request_bodies(served):
    import httpx

    doc = httpx.get(served.url + "/openapi.json").json()
    for path, name in (("/v1/completions", "CompletionRequest"),
                       ("/v1/chat/completions", "ChatCompletionRequest")):
        op = doc["paths"][path]["post"]
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith(name)
        props = doc["components"]["schemas"][name]["properties"]
        assert _bound(props["top_k"], "maximum") == 1 << 20  # the bounds are published
        assert _bound(props["user"], "maxLength") == 256
        assert {"200", "400", "413", "429", "500", "503"} <= set(op["responses"])


def test_every_operation_has_its_own_id(served):
    """Client generators name a method after each operationId: two alike collide (FastAPI
    gives a GET-and-HEAD route one id for both)."""
    import httpx

    doc = httpx.get(served.url + "/openapi.json").json()
    ids = [op["operationId"] for ops in doc["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids)), collections.Counter(ids).most_common(3)
    assert "head" not in doc["paths"]["/health"] and "get" in doc["paths"]["/health"]


def _bound(prop: dict, key: str):
    """`key` of an optional field's schema (pydantic writes `anyOf: [{...}, null]`)."""
    return next(p[key] for p in [prop, *prop.get("anyOf", [])] if key in p)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                         ids=["valid", "invalid"])
def test_schemathesis_finds_no_server_error_or_schema_violation(served, mode):
    schema = schemathesis.openapi.from_url(served.url + "/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert {(o.method.upper(), o.path) for o in operations} >= {
        ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")}
    negative = mode is GenerationMode.NEGATIVE
    checks = CHECKS + ([negative_data_rejection] if negative else [])
    calls = []
    for operation in operations:
        if negative and operation.method.upper() != "POST":
            continue  # nothing to get wrong in a GET without parameters
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck), database=None,
                  derandomize=not os.environ.get("STEPSERVE_FUZZ_RANDOM"))
        def fuzz(case):
            response = case.call(base_url=served.url, timeout=30)
            calls.append(response.status_code)
            case.validate_response(response, checks=checks)

        fuzz()
    assert len(calls) >= EXAMPLES  # it really sent requests
    print(mode, sorted(collections.Counter(calls).items()))
    served.wait_idle()
