"""benchmarks/soak.py, small: 200 streamed requests (32 in flight, ~10% abandoned
mid-stream) against `stepserve serve --model tiny` in a subprocess with a KV pool small
enough to preempt, beside 50 idle connections and 5 slowloris ones held open all along.
Every request gets exactly one answer, the server counts every one, no KV block is left
in use, and every /health probe is answered. RSS and /health's times are printed, not
asserted (200 requests are too few for a stable figure; a shared machine's times vary)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

from soak import SoakConfig, print_report, run_soak  # noqa: E402
from soak_harness import ABORTED, COMPLETED  # noqa: E402

# 200 streams with 30 s deadlines: runs alone, after the parallel part of the suite
pytestmark = pytest.mark.serial


@pytest.mark.slow
def test_soak_200_requests_with_disconnects_and_preemption():
    config = SoakConfig(requests=200, concurrency=32, disconnect_fraction=0.1, seed=0,
                        warmup=16, deadline_s=30.0, idle_connections=50, slowloris=5)
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
    h = r.hostile
    assert (h.idle_opened >= 50, h.slowloris_opened >= 5) == (True, True), h
    assert (h.refused, h.health_failures) == (0, 0), h.problems
    assert h.health_probes > 0
