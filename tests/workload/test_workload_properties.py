"""Property: any valid workload yields well-formed, reproducible requests."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stepserve.workload import (
    ClosedLoop,
    Constant,
    Empirical,
    Fixed,
    Gamma,
    LogNormal,
    Mixture,
    Poisson,
    RequestClass,
    Uniform,
    Workload,
    workload_from_dict,
    workload_to_dict,
)

lengths = st.integers(1, 10_000)
rates = st.floats(0.01, 1000.0)


@st.composite
def lognormals(draw):
    p50 = draw(st.floats(1.0, 5000.0))
    p99 = draw(st.floats(p50, p50 * 200))
    clip = draw(st.one_of(st.none(), st.integers(int(p50) + 1, 20_000)))
    return LogNormal(p50, p99, clip)


@st.composite
def uniforms(draw):
    lo = draw(lengths)
    return Uniform(lo, draw(st.integers(lo, lo + 5000)))


simple_dists = st.one_of(
    lengths.map(Fixed),
    uniforms(),
    lognormals(),
    st.lists(lengths, min_size=1, max_size=20).map(lambda v: Empirical(tuple(v))),
)
dists = st.one_of(
    simple_dists,
    st.lists(st.tuples(st.floats(0.01, 100.0), simple_dists), min_size=1, max_size=4)
    .map(lambda parts: Mixture(tuple(parts))),
)
arrivals = st.one_of(
    rates.map(Poisson),
    st.builds(Gamma, rates, st.floats(0.05, 20.0)),
    rates.map(Constant),
    st.integers(1, 256).map(ClosedLoop),
)


@st.composite
def classes(draw):
    count = draw(st.integers(1, 4))
    return tuple(
        RequestClass(
            name=f"c{i}",
            share=draw(st.floats(0.01, 100.0)),
            prompt=draw(dists),
            output=draw(dists),
            max_tokens=draw(st.one_of(st.none(), lengths)),
            priority=draw(st.integers(-3, 3)),
            tenant=draw(st.sampled_from(["a", "b", "default"])),
            length_estimate=draw(st.sampled_from(["none", "exact", "class_mean"])),
        )
        for i in range(count)
    )


workloads = st.builds(
    Workload,
    name=st.just("prop"),
    classes=classes(),
    arrival=arrivals,
    num_requests=st.integers(1, 200),
    seed=st.integers(0, 2**32),
    duration_s=st.one_of(st.none(), st.floats(0.1, 1000.0)),
)


@settings(max_examples=150, deadline=None)
@given(workloads)
def test_specs_are_well_formed(workload):
    specs = workload.generate()
    assert 0 < len(specs) <= workload.num_requests
    assert [s.index for s in specs] == list(range(len(specs)))
    names = {c.name for c in workload.classes}
    for spec in specs:
        assert spec.prompt_len >= 1
        assert 1 <= spec.output_len <= spec.max_tokens
        assert spec.request_class in names
        assert spec.length_estimate is None or spec.length_estimate >= 1
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(specs, specs[1:], strict=False))
    if workload.duration_s is not None and workload.closed_loop_concurrency is None:
        assert all(s.arrival_s <= workload.duration_s for s in specs)
    assert workload.generate() == specs  # reproducible


@settings(max_examples=100, deadline=None)
@given(workloads)
def test_yaml_shape_round_trips(workload):
    again = workload_from_dict(workload_to_dict(workload))
    assert again == workload
    assert again.generate() == workload.generate()
