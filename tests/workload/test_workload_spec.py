"""Workload generation: determinism, class shares, caps, estimates and validation."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from stepserve.workload import (
    ClosedLoop,
    Poisson,
    RequestClass,
    RequestSpec,
    Workload,
    WorkloadError,
    fixed,
    lognormal,
    uniform,
)


def make_class(name: str = "chat", share: float = 1.0, **overrides) -> RequestClass:
    fields = {"prompt": uniform(100, 300), "output": uniform(50, 400)} | overrides
    return RequestClass(name, share, **fields)


def make_workload(**overrides) -> Workload:
    fields = {
        "name": "test",
        "classes": (make_class("summary", 0.3, prompt=fixed(8192), output=fixed(200)),
                    make_class("chat", 0.7)),
        "arrival": Poisson(5.0),
        "num_requests": 500,
        "seed": 1,
    } | overrides
    return Workload(**fields)


def test_same_seed_same_requests_different_seed_different():
    first = make_workload().generate()
    assert make_workload().generate() == first
    assert make_workload(seed=2).generate() != first
    assert [s.index for s in first] == list(range(500))
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(first, first[1:], strict=False))


def test_changing_the_rate_keeps_the_requests():
    # a rate sweep must compare the same requests at different speeds
    slow = make_workload(arrival=Poisson(1.0)).generate()
    fast = make_workload(arrival=Poisson(50.0)).generate()
    strip = [(s.request_class, s.prompt_len, s.output_len) for s in slow]
    assert strip == [(s.request_class, s.prompt_len, s.output_len) for s in fast]
    assert slow[-1].arrival_s > fast[-1].arrival_s


def test_class_shares_over_10k_requests():
    specs = make_workload(num_requests=10_000).generate()
    counts = Counter(s.request_class for s in specs)
    assert counts["summary"] / 10_000 == pytest.approx(0.3, abs=0.015)
    assert counts["chat"] / 10_000 == pytest.approx(0.7, abs=0.015)
    assert make_workload().shares == pytest.approx({"summary": 0.3, "chat": 0.7})


def test_shares_are_relative_weights():
    w = make_workload(classes=(make_class("a", 3), make_class("b", 1)), num_requests=10_000)
    counts = Counter(s.request_class for s in w.generate())
    assert counts["a"] / 10_000 == pytest.approx(0.75, abs=0.015)


def test_class_fields_reach_the_specs():
    cls = make_class("chat", priority=2, tenant="a")
    spec = make_workload(classes=(cls,)).generate()[0]
    assert (spec.priority, spec.tenant, spec.request_class) == (2, "a", "chat")
    assert spec.max_tokens == spec.output_len  # no cap given: asks for what it gets
    assert spec.length_estimate is None


def test_class_cap_is_max_tokens_and_clips_output():
    cls = make_class(output=uniform(50, 400), max_tokens=200)
    specs = make_workload(classes=(cls,)).generate()
    assert {s.max_tokens for s in specs} == {200}
    assert max(s.output_len for s in specs) == 200  # longer outputs end by length
    assert min(s.output_len for s in specs) < 200


def test_length_estimates():
    exact = make_workload(classes=(make_class(length_estimate="exact"),)).generate()
    assert all(s.length_estimate == s.output_len for s in exact)
    mean = make_workload(classes=(make_class(length_estimate="class_mean"),)).generate()
    assert {s.length_estimate for s in mean} == {225}


def test_closed_loop_workload():
    w = make_workload(arrival=ClosedLoop(64))
    assert w.closed_loop_concurrency == 64
    assert {s.arrival_s for s in w.generate()} == {0.0}
    assert make_workload().closed_loop_concurrency is None


def test_duration_caps_open_loop_arrivals():
    specs = make_workload(num_requests=1000, duration_s=10.0).generate()
    assert 20 < len(specs) < 100 and all(s.arrival_s <= 10.0 for s in specs)
    # closed loop has no arrival times to cap: the runner stops issuing instead
    assert len(make_workload(arrival=ClosedLoop(8), duration_s=10.0).generate()) == 500


def test_describe_names_every_class():
    text = make_workload().describe()
    assert "summary 30.0%" in text and "chat 70.0%" in text and "poisson 5 req/s" in text


@pytest.mark.parametrize("overrides,message", [
    ({"num_requests": 0}, r"num_requests = 0: must be an integer in \[1, 1000000\]"),
    ({"seed": "x"}, "seed = 'x': must be an integer"),
    ({"classes": ()}, r"classes = \[\]: a workload needs at least one request class"),
    ({"classes": (make_class("a"), make_class("a"))},
     r"classes\[1\]\.name = 'a': names must be unique"),
    ({"arrival": "poisson"}, "arrival = 'poisson': must be an arrival process"),
    ({"duration_s": -5}, r"duration_s = -5: must be a finite number in \(0, 2592000\]"),
    ({"name": ""}, "name = '': must be a non-empty string"),
])
def test_bad_workloads(overrides, message):
    with pytest.raises(WorkloadError, match=message):
        make_workload(**overrides)


@pytest.mark.parametrize("overrides,message", [
    ({"share": 0}, r"share = 0: must be a finite number in \(0, 1000000000\]"),
    ({"share": -0.3}, r"share = -0\.3: must be a finite number in \(0, "),
    ({"max_tokens": 0}, r"max_tokens = 0: must be an integer in \[1, 1048576\]"),
    ({"length_estimate": "oracle"},
     "length_estimate = 'oracle': must be one of none, exact, class_mean"),
    ({"prompt": 300}, "prompt = 300: must be a length distribution"),
    ({"priority": 1.5}, r"priority = 1\.5: must be an integer"),
])
def test_bad_classes(overrides, message):
    fields = {"name": "chat", "share": 1.0, "prompt": fixed(10), "output": lognormal(20, 200)}
    with pytest.raises(WorkloadError, match=message):
        RequestClass(**(fields | overrides))


def test_request_spec_invariants():
    spec = RequestSpec(0, 0.0, 10, 5, 5)
    with pytest.raises(WorkloadError, match="output_len = 6: must be <= max_tokens = 5"):
        dataclasses.replace(spec, output_len=6)
    with pytest.raises(WorkloadError,
                       match=r"prompt_len = 0: must be an integer in \[1, 1048576\]"):
        dataclasses.replace(spec, prompt_len=0)
    with pytest.raises(WorkloadError, match=r"arrival_s = -1: must be a finite number >= 0"):
        dataclasses.replace(spec, arrival_s=-1.0)
