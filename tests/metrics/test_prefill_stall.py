"""The doctor names prefill-heavy steps that stall decoding, with the step times as
evidence and a smaller step budget as the action; on a simulated CPU-like engine (32 in
flight, 128-token prompts, 64-token outputs: the CPU prefill-wave bench) it fires with an
8,192-token budget, where every wave of prompts is prefilled in one multi-second step,
and not with the budget it recommends, which brings TTFT down once the first waves (all
sent at once) have passed."""

from __future__ import annotations

import re

from stepserve.config.settings import EngineConfig
from stepserve.metrics.percentiles import percentile
from stepserve.metrics.rules import prefill_stalls_decode
from stepserve.metrics.run_summary import RunSummary
from stepserve.sim.calibrated import CalibratedCost
from stepserve.sim.loop import SimResult
from stepserve.sim.run import simulate_run
from stepserve.workload.spec import RequestSpec

# a CPU-like engine: 30 ms a step, 2 ms per token (prefill is what costs)
CPU = CalibratedCost({"step": 0.030, "seq": 1e-3, "token": 2e-3})


def _run(budget: int) -> tuple[RunSummary, SimResult]:
    config = EngineConfig().replace(max_num_batched_tokens=budget, max_num_seqs=64,
                                    long_prefill_token_threshold=budget // 2 if budget < 8192
                                    else 0, max_model_len=2048)
    specs = [RequestSpec(i, 0.0, 128, 64, 64) for i in range(320)]
    run, sim = simulate_run(f"budget {budget}", config, specs, CPU, 4096, 32)
    return run.summary, sim


def _steady_ttft(sim: SimResult) -> list[float]:
    """TTFT after the first two waves of 32 (sent at once: a cold start either way)."""
    return [r.ttft for r in sim.requests if int(r.request_id) >= 64]


def test_the_advice_names_the_budget_and_the_step_times():
    s = RunSummary.of(step_p99_s=8.0, step_max_s=8.4, decode_step_p50_s=0.15,
                      prefill_token_share=0.67, ttft_p50_s=8.5, max_num_batched_tokens=8192)
    f = prefill_stalls_decode(s)
    assert f is not None
    assert "step time P99 8 s is 53x the median decode step (0.15 s" in f.evidence
    assert "longest step took 8.4 s" in f.evidence and "TTFT P50 8.5 s" in f.evidence
    # 8192 x 3 x 0.15 / 8 = 461: the power of two below it
    assert "from 8192 toward 256" in f.action and "long_prefill_token_threshold to 128" \
        in f.action


def test_fires_on_a_prefill_heavy_budget_and_not_on_the_one_it_recommends():
    big, big_sim = _run(8192)
    found = prefill_stalls_decode(big)
    assert found is not None, big
    budget = int(re.search(r"toward (\d+)", found.action).group(1))
    assert budget < 8192
    small, small_sim = _run(budget)
    assert prefill_stalls_decode(small) is None, small
    # the smaller budget: TTFT P50 and the steady-state P99 fall, throughput holds
    assert small.ttft_p50_s < big.ttft_p50_s / 5
    assert percentile(_steady_ttft(small_sim), 99) < percentile(_steady_ttft(big_sim), 99) / 3
    assert small.throughput_tokens_per_s > 0.95 * big.throughput_tokens_per_s
