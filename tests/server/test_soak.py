"""benchmarks/soak.py, small: 200 streamed requests (32 in flight, ~10% abandoned
mid-stream) against `stepserve serve --model tiny` in a subprocess with a KV pool small
enough to preempt. Every request gets exactly one answer, the server counts every one,
and no KV block is left in use. RSS is printed, not asserted (200 requests are too few
for a stable figure)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

from soak import SoakConfig, print_report, run_soak  # noqa: E402
from soak_harness import ABORTED, COMPLETED  # noqa: E402


@pytest.mark.slow
def test_soak_200_requests_with_disconnects_and_preemption():
    config = SoakConfig(requests=200, concurrency=32, disconnect_fraction=0.1, seed=0,
                        warmup=16, deadline_s=30.0)
    r = run_soak(config)
    print_report(config, r)

    assert (r.lost, r.hung) == (0, 0), r.problems
    assert r.outcomes[COMPLETED] + r.outcomes[ABORTED] == 200, r.outcomes
    assert r.outcomes[ABORTED] > 0 and r.server_ended.get("abort", 0) > 0  # disconnects
    assert r.preemptions > 0
    assert (r.blocks_used_after, r.running_after, r.waiting_after, r.swapped_after) == \
        (0, 0, 0, 0)
    assert r.server_total == r.sent == 200, (r.server_ended, r.server_rejected)
    assert r.accounted
    assert r.server_exit_status == 0
