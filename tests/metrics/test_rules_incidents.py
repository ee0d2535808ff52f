"""On the three incidents' fixed configurations (night-report's continuous batch,
mixed-pool's and promo-spike's "after"), the doctor fires nothing that the run's own
figures do not support. The runs come from the scenario functions, so the checks hold
whatever the scenarios' workloads are tuned to: each finding is checked against the
figures it rests on, not against numbers written here."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stepserve.metrics.percentiles import ratio
from stepserve.metrics.rules import RIDE_ALONG_RATIO, STALL_RATIO, RuleSettings, diagnose
from stepserve.metrics.run_summary import RunSummary
from stepserve.sim.run import RunResult, run_scenario
from stepserve.sim.scenarios import get_scenario

FIXED = [("night-report", "continuous"), ("mixed-pool", "after"), ("promo-spike", "after")]
pytestmark = pytest.mark.slow  # three full scenario runs, ~30 s of CPU


def _share(part: float | None, whole: float | None) -> float:
    return ratio(part or 0, whole) or 0.0


def _stall(s: RunSummary, cfg: RuleSettings) -> bool:
    pace = s.decode_step_p50_s or s.tpot_p50_s
    over = s.step_p99_s > STALL_RATIO * pace
    rides = cfg.budget_order == "decode_first" and (s.zero_decode_step_share or 0) < 0.01
    return over and (not rides or s.step_p99_s > RIDE_ALONG_RATIO * s.tpot_p50_s)


# What in a run's own figures backs each rule's finding.
SUPPORT: dict[str, Callable[[RunSummary, RuleSettings], bool]] = {
    "rejections": lambda s, c: _share(s.requests_rejected, s.requests_total) >= 0.01,
    "timeouts": lambda s, c: _share(s.requests_timed_out, s.requests_total) >= 0.01,
    "capacity": lambda s, c: bool(s.preemptions) and max(
        s.p99_p50_e2e_ratio or 0, s.p99_p50_ttft_ratio or 0) > 10,
    "preemption_nonzero": lambda s, c: bool(s.preemptions),
    "queue_growing": lambda s, c: s.waiting_growth > 0 and s.waiting_max >= 10,
    "running_below_offered": lambda s, c: s.waiting_nonzero_share > 0.5 and s.waiting_p50 > 0,
    "chunk_cap_eats_budget": lambda s, c: s.prefill_step_share > 0.7
    or s.zero_decode_step_share > 0.1,
    "prefill_stalls_decode": _stall,
    "tail_ttft_from_prefill": lambda s, c: s.p99_p50_ttft_ratio >= 5,
    "tpot_tail": lambda s, c: s.p99_p50_tpot_ratio >= 5,
    "throughput_over_experience": lambda s, c: (s.goodput_requests_per_s is not None) or (
        s.ttft_p99_s > 5 and s.running_max >= 0.9 * c.max_num_seqs * (c.replicas or 1)),
    "low_slot_utilization": lambda s, c: s.slot_utilization < 0.5,
    "low_active_ratio": lambda s, c: s.active_ratio_p50 < 0.3,
}


@pytest.fixture(scope="module", params=FIXED, ids=[f"{s}-{r}" for s, r in FIXED])
def fixed_run(request) -> RunResult:
    scenario, run = request.param
    result = run_scenario(get_scenario(scenario), only=[run])
    return result.runs[0]


def test_every_finding_is_backed_by_the_runs_own_figures(fixed_run):
    s, cfg = fixed_run.summary, fixed_run.rule_settings()
    for f in diagnose(s, cfg):
        assert SUPPORT[f.rule](s, cfg), (fixed_run.name, f)
        if f.rule in ("queue_growing", "chunk_cap_eats_budget", "low_active_ratio"):
            assert "in this run" in f.evidence, f  # the lead measured, not quoted


def test_the_chunk_rules_hold_their_peace_on_a_bounded_chunk(fixed_run):
    """The mixed-pool fix (budget 8192, chunk cap 2048, decode first): each step carries
    at most a bounded chunk and every running sequence rides in it."""
    s, cfg = fixed_run.summary, fixed_run.rule_settings()
    found = {f.rule: f for f in diagnose(s, cfg)}
    assert ("prefill_stalls_decode" in found) == _stall(s, cfg), found
    if cfg.long_prefill_token_threshold and cfg.budget_order == "decode_first" and \
            cfg.long_prefill_token_threshold < cfg.max_num_batched_tokens:
        assert "chunk_cap_eats_budget" not in found or SUPPORT["chunk_cap_eats_budget"](s, cfg)
        tail = found.get("tail_ttft_from_prefill")
        assert tail is None or tail.severity == "info", tail
