"""The arrival process and request list `stepserve bench` builds from its flags."""

from __future__ import annotations

import argparse

import pytest

from stepserve.bench.workload_options import build_workload, make_specs
from stepserve.cli.bench import add_bench_parser, bench_options
from stepserve.workload.arrivals import ClosedLoop, Constant, Gamma, Poisson

BASE = ["bench", "--sim", "--random-input-len", "8", "--random-output-len", "4",
        "--num-prompts", "50"]


def _specs(*flags: str):
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    options = bench_options(parser.parse_args([*BASE, *flags])).workload
    workload = build_workload(options)
    return workload, make_specs(options, workload)


@pytest.mark.parametrize("flags, kind", [
    (["--request-rate", "10"], Poisson),
    (["--request-rate", "10", "--burstiness", "0.5"], Gamma),
    (["--request-rate", "10", "--burstiness", "inf"], Constant),
    (["--max-concurrency", "4"], ClosedLoop),
])
def test_arrival_process_from_flags(flags, kind):
    workload, specs = _specs(*flags)
    assert isinstance(workload.arrival, kind) and len(specs) == 50


def test_constant_rate_spaces_requests_evenly_and_bursty_does_not():
    _, specs = _specs("--request-rate", "10", "--burstiness", "inf")
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(specs, specs[1:])]
    assert all(g == pytest.approx(0.1) for g in gaps)
    _, bursty = _specs("--request-rate", "10", "--burstiness", "0.25")
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(bursty, bursty[1:])]
    assert max(gaps) > 0.3 and min(gaps) < 0.01
    _, at_once = _specs("--request-rate", "inf")
    assert {s.arrival_s for s in at_once} == {0.0}
