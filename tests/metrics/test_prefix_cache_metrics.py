"""The prefix cache in a run's summary: the hit rate (cached prompt tokens / prompt
tokens of completed requests), the repeated share (prompt tokens an earlier prompt began
with: what a cache that never evicted could give), and the rule that reads the two."""

from __future__ import annotations

from unittest.mock import patch

from stepserve.config.settings import EngineConfig
from stepserve.core.request import FinishReason, Request, RequestStatus, SamplingParams
from stepserve.metrics.request_metrics import measure_requests, repeated_prefix_tokens
from stepserve.metrics.result_runs import impossible_values
from stepserve.metrics.rules import RULES, diagnose, prefix_cache_thrash
from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.summary import request_summary
from stepserve.sim import loop
from stepserve.sim.cost import ConstantCost
from stepserve.sim.run import run_result
from stepserve.workload.spec import RequestSpec


def prompt(rid: str, ids: list[int], arrival: float = 0.0, salt: str | None = None,
           cached: int = 0) -> Request:
    req = Request(rid, ids, SamplingParams(max_tokens=1), arrival, cache_salt=salt)
    req.output_token_ids, req.token_times = [7], [arrival + 1.0]
    req.first_scheduled_time = arrival
    req.status = RequestStatus.FINISHED_LENGTH
    req.finish_reason = FinishReason.LENGTH
    req.num_cached_tokens = cached
    return req


SYSTEM = [5] * 64  # four 16-token blocks


def test_a_prompt_repeats_the_blocks_an_earlier_prompt_began_with():
    first = prompt("a", SYSTEM + list(range(100, 140)), 0.0)
    second = prompt("b", SYSTEM + list(range(200, 240)), 1.0)
    other = prompt("c", list(range(300, 400)), 2.0)
    assert repeated_prefix_tokens([first, second, other]) == [0, 64, 0]


def test_arrival_order_not_list_order_says_who_came_first():
    late = prompt("late", SYSTEM + [9] * 20, 5.0)
    early = prompt("early", SYSTEM + [8] * 20, 1.0)
    assert repeated_prefix_tokens([late, early]) == [64, 0]


def test_a_whole_repeated_prompt_keeps_its_last_token_and_salts_do_not_share():
    same = [prompt(str(i), [4] * 33, float(i)) for i in range(2)]
    assert repeated_prefix_tokens(same) == [0, 32]  # (33 - 1) // 16 blocks
    salted = [prompt("x", SYSTEM + [1], 0.0, salt="t1"), prompt("y", SYSTEM + [1], 1.0,
                                                                  salt="t2")]
    assert repeated_prefix_tokens(salted) == [0, 0]


def test_distinct_prompts_with_a_common_later_block_repeat_nothing():
    """Only a prefix counts: the same block after different openings is not shareable."""
    reqs = [prompt(str(i), [1000 + i] * 16 + SYSTEM, float(i)) for i in range(3)]
    assert repeated_prefix_tokens(reqs) == [0, 0, 0]


def test_the_summary_carries_hit_rate_and_repeated_share_over_completed_requests():
    reqs = [prompt("a", SYSTEM + [1] * 36, 0.0),
            prompt("b", SYSTEM + [2] * 36, 1.0, cached=32),
            prompt("c", SYSTEM + [3] * 36, 2.0, cached=64)]
    s = request_summary(measure_requests(reqs), 10.0)
    assert s.prefix_cache_hit_rate == (32 + 64) / 300
    assert s.prefix_repeated_share == (64 + 64) / 300
    assert "prefix_cache_hit_rate" in s.to_json() and "prefix_repeated_share" in s.to_json()
    assert impossible_values({"prefix_cache_hit_rate": 1.5}) == [
        "prefix_cache_hit_rate = 1.5: must be a finite number in [0, 1] (a share)"]


# ---- the thrash rule ----

def test_the_rule_fires_on_a_cache_that_kept_little_of_a_repeating_workload():
    f = prefix_cache_thrash(RunSummary.of(prefix_cache_hit_rate=0.05,
                                          prefix_repeated_share=0.80, kv_usage_max=1.0))
    assert f is not None and f.severity == "warning"
    assert "80.0%" in f.evidence and "5.0%" in f.evidence and "100.0%" in f.evidence
    for advice in ("--num-gpu-blocks-override", "prefix_affinity",
                   "--scheduling-policy lpm"):
        assert advice in f.action


def test_the_rule_is_silent_on_a_healthy_cache_and_with_nothing_to_share():
    healthy = RunSummary.of(prefix_cache_hit_rate=0.70, prefix_repeated_share=0.80)
    distinct = RunSummary.of(prefix_cache_hit_rate=0.0, prefix_repeated_share=0.0)
    little = RunSummary.of(prefix_cache_hit_rate=0.0, prefix_repeated_share=0.10)
    unmeasured = RunSummary.of(prefix_cache_hit_rate=0.0)  # a bench without the share
    for s in (healthy, distinct, little, unmeasured):
        assert prefix_cache_thrash(s) is None
    assert "prefix_cache_thrash" in {r.name for r in RULES}


def _shared(groups: int, shared_len: int):
    """Request i opens with system prompt i % groups, then ids of its own."""
    def ids(spec: RequestSpec) -> list[int]:
        head = [10_000 + spec.index % groups] + [2] * (shared_len - 1)
        return head + [loop.FIRST_PROMPT_ID + spec.index] * (spec.prompt_len - shared_len)
    return patch.object(loop, "prompt_token_ids", ids)


def _simulated(num_gpu_blocks: int) -> RunSummary:
    """16 system prompts of 256 tokens taken in turn, one request at a time: a pool that
    holds them all hits after the first round, one that holds two evicts each before its
    turn comes again."""
    config = EngineConfig().replace(max_model_len=512, block_size=16)
    specs = [RequestSpec(i, 0.1 * i, 288, 2, 2) for i in range(96)]
    with _shared(16, 256):
        sim = loop.simulate(config, specs, ConstantCost(0.01), num_gpu_blocks)
    return run_result("r", config, sim).summary


def test_a_simulated_pool_too_small_for_its_prefixes_thrashes_and_a_big_one_does_not():
    small, big = _simulated(40), _simulated(400)
    assert small.prefix_repeated_share == big.prefix_repeated_share == 80 * 256 / (96 * 288)
    assert small.prefix_cache_hit_rate == 0.0
    assert big.prefix_cache_hit_rate == small.prefix_repeated_share
    assert "prefix_cache_thrash" in [f.rule for f in diagnose(small)]
    assert "prefix_cache_thrash" not in [f.rule for f in diagnose(big)]
