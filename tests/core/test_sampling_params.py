"""SamplingParams takes the same ranges as the HTTP API (request_limits.py): offline
callers get the same clear refusals, and nothing out of range reaches the sampler."""

from __future__ import annotations

import math

import pytest

from stepserve.core.request import SamplingParams

BAD = [
    (dict(top_k=2**63), "top_k"),
    (dict(top_k=-2), "top_k"),
    (dict(top_k=1.5), "top_k"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=2**40), "max_tokens"),
    (dict(max_tokens=True), "max_tokens"),
    (dict(temperature=math.nan), "temperature"),
    (dict(temperature=math.inf), "temperature"),
    (dict(temperature=-0.5), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=math.nan), "top_p"),
    (dict(seed=2**64), "seed"),
    (dict(seed=-(2**64)), "seed"),
    (dict(priority=2**40), "priority"),
    (dict(priority=1.0), "priority"),
    (dict(stop=["x"] * 33), "stop"),
    (dict(stop="s" * 1025), "stop"),
    (dict(stop=[5]), "stop"),
    (dict(stop_token_ids=[-1]), "stop_token_ids"),
    (dict(stop_token_ids=[1] * 1025), "stop_token_ids"),
    (dict(tenant="t" * 257), "tenant"),
]


@pytest.mark.parametrize("kwargs,field", BAD, ids=[f"{k}" for k, _ in BAD])
def test_out_of_range_values_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_edges_and_vllm_spellings_are_accepted():
    assert SamplingParams(top_k=-1).top_k == 0  # vLLM's "off"
    SamplingParams(top_k=1 << 20, max_tokens=2**31 - 1, temperature=2.0, top_p=1.0,
                   seed=2**63 - 1, priority=-(2**31), stop=["x"] * 32,
                   stop_token_ids=[0] * 1024, tenant="t" * 256)
