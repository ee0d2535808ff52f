"""Prefix caching in the simulator: it runs the engine's own KV manager, so prompts that
share token ids share blocks there too; and a simulation with shared blocks is the same
whether decode runs (core/decode_run.py) apply its decode-only steps or it steps one by
one (blocks taken and released in the same order, reference counts right, the same
blocks named, twins included: requests whose whole prompts match fill blocks of the same
name at the same time)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import astuple
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepserve.config.settings import EngineConfig
from stepserve.core.kv_cache import Chain
from stepserve.sim import loop
from stepserve.sim.cost import ConstantCost
from stepserve.sim.loop import simulate
from stepserve.workload.spec import RequestSpec


@contextmanager
def shared_prompts(groups: int, shared_len: int):
    """Request i's prompt starts with the `shared_len` ids of group i % groups (its
    system prompt), then its own ids; a prompt no longer than that is the group's."""
    def ids(spec: RequestSpec) -> list[int]:
        own = loop.FIRST_PROMPT_ID + spec.index
        head = [10_000 + spec.index % groups] + [2] * (shared_len - 1)
        return (head + [own] + [1] * spec.prompt_len)[:spec.prompt_len]

    with patch.object(loop, "prompt_token_ids", ids):
        yield


def snapshot(sim):
    requests = [(r.request_id, r.status, r.finish_reason, r.finish_time,
                 tuple(r.output_token_ids), tuple(r.token_times), r.num_computed_tokens,
                 r.first_scheduled_time, r.num_preemptions, r.num_cached_tokens)
                for r in sim.requests]
    return requests, [[astuple(s) for s in per] for per in sim.steps], sim.duration_s


def specs_of(rows):
    t, specs = 0.0, []
    for i, (gap, prompt, out) in enumerate(rows):
        t += gap
        specs.append(RequestSpec(i, t, prompt, out, out))
    return specs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(st.sampled_from([0.0, 0.01, 0.05, 0.2]), st.integers(1, 90),
                               st.integers(1, 50)), min_size=1, max_size=30),
       groups=st.integers(1, 3), shared_len=st.sampled_from([8, 24, 60, 200]),
       preemption=st.sampled_from(["recompute", "swap"]), blocks=st.integers(20, 60),
       max_num_seqs=st.integers(1, 10))
def test_shared_blocks_come_out_the_same_with_and_without_decode_runs(
        rows, groups, shared_len, preemption, blocks, max_num_seqs):
    config = EngineConfig().replace(
        max_model_len=160, block_size=8, max_num_seqs=max_num_seqs, max_num_batched_tokens=64,
        preemption_mode=preemption, num_cpu_blocks=40 if preemption == "swap" else 0)
    specs = specs_of(rows)
    with shared_prompts(groups, shared_len):
        stepped = simulate(config, specs, ConstantCost(0.02), blocks, decode_runs=False)
        fast = simulate(config, specs, ConstantCost(0.02), blocks)
    assert snapshot(fast) == snapshot(stepped)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(st.sampled_from([0.0, 0.01, 0.05]), st.integers(1, 90),
                               st.integers(1, 40)), min_size=1, max_size=30),
       groups=st.integers(1, 3), shared_len=st.sampled_from([8, 24, 60]),
       preemption=st.sampled_from(["recompute", "swap"]), blocks=st.integers(20, 50))
def test_a_simulation_is_the_same_whichever_hash_names_the_blocks(
        rows, groups, shared_len, preemption, blocks):
    """builtin, xxhash and sha256 give the same hits, evictions and twins: only what a
    name costs differs (prefix_caching_hash_algo)."""
    config = EngineConfig().replace(
        max_model_len=160, block_size=8, max_num_seqs=6, max_num_batched_tokens=64,
        preemption_mode=preemption, num_cpu_blocks=40 if preemption == "swap" else 0)
    specs = specs_of(rows)
    with shared_prompts(groups, shared_len):
        runs = [snapshot(simulate(config.replace(prefix_caching_hash_algo=algo), specs,
                                  ConstantCost(0.02), blocks))
                for algo in ("builtin", "xxhash", "sha256")]
    assert runs[0] == runs[1] == runs[2]


@contextmanager
def every_block_named_at_once():
    """The KV manager with naming on demand turned off: a chain is never filed, so
    cache_blocks names each block as it is computed."""
    real = Chain.__init__

    def init(self, *args):
        real(self, *args)
        self.leave()

    with patch.object(Chain, "__init__", init):
        yield


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(st.sampled_from([0.0, 0.01, 0.05]), st.integers(1, 90),
                               st.integers(1, 40)), min_size=1, max_size=30),
       groups=st.integers(1, 3), shared_len=st.sampled_from([8, 24, 60]),
       preemption=st.sampled_from(["recompute", "swap"]), blocks=st.integers(20, 50),
       policy=st.sampled_from(["fcfs", "lpm"]))
def test_naming_blocks_on_demand_shares_what_naming_them_at_once_shares(
        rows, groups, shared_len, preemption, blocks, policy):
    """The hits, evictions, twins and counters of a run are the same whether a block is
    named when computed or only when a lookup's first block could lead to it."""
    config = EngineConfig().replace(
        max_model_len=160, block_size=8, max_num_seqs=6, max_num_batched_tokens=64,
        preemption_mode=preemption, num_cpu_blocks=40 if preemption == "swap" else 0,
        policy=policy)
    specs = specs_of(rows)
    with shared_prompts(groups, shared_len):
        on_demand = simulate(config, specs, ConstantCost(0.02), blocks)
        with every_block_named_at_once():
            at_once = simulate(config, specs, ConstantCost(0.02), blocks)
    assert snapshot(on_demand) == snapshot(at_once)
    assert [r.num_cached_tokens for r in on_demand.requests] == \
        [r.num_cached_tokens for r in at_once.requests]


@pytest.mark.parametrize("algo", ["builtin", "xxhash", "sha256"])
def test_a_shared_system_prompt_is_computed_once_and_hit_after(algo):
    """40 requests, one 96-token system prompt and 32 tokens each of their own, arriving
    0.1 s apart (each ends before the next): every one after the first computes only its
    own part, and the fast path still takes the decode steps."""
    config = EngineConfig().replace(max_model_len=256, block_size=16,
                                    prefix_caching_hash_algo=algo)
    specs = specs_of([(0.1, 128, 4)] * 40)
    with shared_prompts(1, 96):
        sim = simulate(config, specs, ConstantCost(0.01), 64)
    cached = [r.num_cached_tokens for r in sim.requests]
    assert cached == [0] + [96] * 39
    prefill = sum(s.num_prefill_tokens for s in sim.all_steps)
    assert prefill == 128 + 39 * 32
    config_off = config.replace(enable_prefix_caching=False)
    with shared_prompts(1, 96):
        off = simulate(config_off, specs, ConstantCost(0.01), 64)
    assert sum(s.num_prefill_tokens for s in off.all_steps) == 40 * 128


def test_distinct_simulated_prompts_share_nothing():
    config = EngineConfig().replace(max_model_len=256, block_size=16)
    sim = simulate(config, specs_of([(0.05, 100, 8)] * 20), ConstantCost(0.01), 64)
    assert all(r.num_cached_tokens == 0 for r in sim.requests)
