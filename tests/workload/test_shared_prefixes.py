"""Shared prefixes: a class's requests open with one of its N system prompts of L tokens
(the YAML keys, their checks, the specs they give, the simulator's prompt ids)."""

from __future__ import annotations

import pytest

from stepserve.sim.loop import prompt_token_ids
from stepserve.workload.errors import WorkloadError
from stepserve.workload.loader import workload_from_dict, workload_to_dict
from stepserve.workload.spec import RequestSpec


def workload(**cls):
    return workload_from_dict({
        "num_requests": 200, "arrival": {"poisson": {"rate": 5}},
        "classes": [{"name": "chat", "prompt": {"uniform": [10, 50]}, "output": 20, **cls},
                    {"name": "plain", "prompt": 30, "output": 20}]})


def test_each_request_opens_with_one_of_its_class_prefixes():
    w = workload(shared_prefixes=4, prefix_len=64)
    specs = w.generate()
    chat = [s for s in specs if s.request_class == "chat"]
    assert {s.prefix for s in chat} == {f"chat/{k}" for k in range(4)}
    assert all(s.prefix_len == 64 and 74 <= s.prompt_len <= 114 for s in chat)
    assert all(s.prefix is None and s.prompt_len == 30 for s in specs if s not in chat)
    assert workload_from_dict(workload_to_dict(w)) == w
    assert "one of 4 shared prefixes of 64 tokens" in w.describe()


def test_a_class_without_prefixes_draws_the_same_requests_as_before():
    assert workload().generate() == workload(shared_prefixes=0, prefix_len=0).generate()


@pytest.mark.parametrize("cls,message", [
    ({"shared_prefixes": 4}, "shared_prefixes = 4, prefix_len = 0: give both"),
    ({"prefix_len": 64}, "shared_prefixes = 0, prefix_len = 64: give both"),
    ({"shared_prefixes": -1, "prefix_len": 8}, "shared_prefixes = -1"),
    ({"shared_prefixes": 200_000, "prefix_len": 8}, "shared_prefixes = 200000"),
    ({"shared_prefixes": 2, "prefix_len": "long"}, "prefix_len"),
    ({"shared_prefixes": True, "prefix_len": 8}, "shared_prefixes"),
])
def test_bad_prefix_keys_are_refused_by_name(cls, message):
    with pytest.raises(WorkloadError, match=rf"classes\[0\].*{message}"):
        workload(**cls)


def test_simulated_prompts_share_exactly_their_prefix():
    a1, a2, b = (RequestSpec(i, 0.0, 40, 1, 1, prefix=p, prefix_len=32)
                 for i, p in enumerate(["chat/0", "chat/0", "chat/1"]))
    ids = [prompt_token_ids(s) for s in (a1, a2, b)]
    assert ids[0][:32] == ids[1][:32] and ids[0][32] != ids[1][32]
    assert ids[0][0] != ids[2][0]  # another prefix: no block in common
    lone = prompt_token_ids(RequestSpec(5, 0.0, 40, 1, 1))
    assert lone[0] not in {i for p in ids for i in p}


def test_a_spec_prefix_must_fit_its_prompt():
    with pytest.raises(WorkloadError, match="prefix_len = 50"):
        RequestSpec(0, 0.0, 40, 1, 1, prefix="chat/0", prefix_len=50)
