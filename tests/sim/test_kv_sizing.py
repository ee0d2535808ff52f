"""KV blocks per simulated replica (num_gpu_blocks_for) and the cost model picked by name."""

from __future__ import annotations

import pytest

from stepserve.config.errors import UsageError
from stepserve.config.limits import MAX_BLOCKS, MAX_LEN, MAX_NUM_SEQS
from stepserve.config.settings import EngineConfig
from stepserve.plan.model_specs import get_model_spec
from stepserve.sim.cost import ConstantCost
from stepserve.sim.cost_options import CostModelOptions, cost_setup_for
from stepserve.sim.roofline import RooflineCost
from stepserve.sim.run import plan_runs
from stepserve.sim.scenarios import RunSpec, get_scenario, num_gpu_blocks_for

CONFIG = EngineConfig().replace(max_num_seqs=8, max_model_len=1024, block_size=16)


def test_the_configs_own_block_count_wins():
    config = CONFIG.replace(num_gpu_blocks=300)
    assert num_gpu_blocks_for(config, 10**9, 1024) == 300


def test_a_kv_size_gives_bytes_over_bytes_per_block():
    assert num_gpu_blocks_for(CONFIG, 16 * 1024 * 100 + 5, 1024) == 100


@pytest.mark.parametrize("kv_bytes, per_token", [(None, None), (0, 1024), (10**9, None)])
def test_without_a_kv_size_max_num_seqs_sequences_of_max_model_len_fit(kv_bytes, per_token):
    assert num_gpu_blocks_for(CONFIG, kv_bytes, per_token) == 8 * (1024 // 16)


def test_a_scenario_sizes_its_pool_with_the_same_rule():
    scenario = get_scenario("promo-spike")
    config = scenario.runs[0].config
    assert scenario.num_gpu_blocks(config) == num_gpu_blocks_for(
        config, 38 * 10**9, get_model_spec("qwen2.5-14b").kv_bytes_per_token)


def test_roofline_brings_its_kv_size_and_constant_none():
    roofline = cost_setup_for(CostModelOptions(hardware="h100", model_spec="llama-3-8b"))
    assert isinstance(roofline.cost_model, RooflineCost)
    per_token = get_model_spec("llama-3-8b").kv_bytes_per_token
    assert roofline.kv_bytes_per_token == per_token
    assert roofline.num_gpu_blocks(CONFIG) == num_gpu_blocks_for(
        CONFIG, roofline.cost_model.kv_cache_bytes(), per_token)
    constant = cost_setup_for(CostModelOptions(cost="constant", step_ms=10.0))
    assert constant.cost_model == ConstantCost(0.01)
    assert constant.num_gpu_blocks(CONFIG) == num_gpu_blocks_for(CONFIG)


@pytest.mark.parametrize("options, flag", [(CostModelOptions(model_spec="nope"), "--model-spec"),
                                           (CostModelOptions(hardware="nope"), "--hardware")])
def test_an_unknown_preset_is_a_usage_error(options, flag):
    with pytest.raises(UsageError, match=flag):
        cost_setup_for(options)


# The largest max_num_seqs at the longest max_model_len whose sequences fill MAX_BLOCKS
# exactly: 65,536 sequences of 256 blocks of 16 tokens.
AT_LIMIT = EngineConfig().replace(max_num_seqs=MAX_NUM_SEQS, max_model_len=4096, block_size=16)


def test_max_num_seqs_sequences_filling_max_blocks_exactly_are_accepted_and_planned():
    assert num_gpu_blocks_for(AT_LIMIT) == MAX_BLOCKS
    (run,) = plan_runs([RunSpec("at-limit", AT_LIMIT)], num_gpu_blocks_for)  # not simulated
    assert run.num_gpu_blocks == MAX_BLOCKS


def test_one_token_more_a_sequence_is_refused_naming_the_inputs_and_what_is_allowed():
    with pytest.raises(UsageError) as e:
        num_gpu_blocks_for(AT_LIMIT.replace(max_model_len=4097))
    assert str(e.value).startswith("max_num_seqs 65,536 x max_model_len 4,097 (block_size 16): "
                                   "16,842,752 KV blocks, 257 a sequence")
    assert f"at most {MAX_BLOCKS:,}, so at most max_num_seqs 65,280" in str(e.value)
    # and the max_num_seqs it names is accepted
    assert num_gpu_blocks_for(AT_LIMIT.replace(max_model_len=4097, max_num_seqs=65_280)) \
        == 65_280 * 257 <= MAX_BLOCKS


def test_the_largest_settings_allowed_are_refused_up_front_with_the_largest_that_fits():
    with pytest.raises(UsageError, match="so at most max_num_seqs 256 at this max_model_len"):
        num_gpu_blocks_for(EngineConfig().replace(max_num_seqs=MAX_NUM_SEQS,
                                                  max_model_len=MAX_LEN))


@pytest.mark.parametrize("config, kv_bytes", [
    (CONFIG.replace(kv_cache_memory=MAX_BLOCKS * 16), None),  # the config's own size
    (CONFIG, MAX_BLOCKS * 16),  # the cost model's
])
def test_a_kv_size_of_max_blocks_is_accepted_and_one_block_more_refused(config, kv_bytes):
    assert num_gpu_blocks_for(config, kv_bytes, 1) == MAX_BLOCKS
    over = (config.replace(kv_cache_memory=(MAX_BLOCKS + 1) * 16)
            if config.cache.kv_cache_memory else config)
    with pytest.raises(UsageError, match=f"= {MAX_BLOCKS + 1:,} blocks of 16 tokens: the "
                                         f"simulator holds at most {MAX_BLOCKS:,}"):
        num_gpu_blocks_for(over, kv_bytes and (MAX_BLOCKS + 1) * 16, 1)


@pytest.mark.parametrize("config, kv_bytes, named", [
    (CONFIG, 1024 * 16 * 63, "the cost model's KV cache of 1,032,192 bytes"),
    (CONFIG.replace(kv_cache_memory=100), None, "kv_cache_memory of 100 bytes"),
    (CONFIG.replace(num_gpu_blocks=63), 10**9, "cache.num_gpu_blocks = 63"),
])
def test_a_pool_short_of_one_max_model_len_sequence_is_refused_naming_its_source(
        config, kv_bytes, named):
    with pytest.raises(UsageError, match="cannot hold one sequence of max_model_len = 1,024") \
            as e:
        num_gpu_blocks_for(config, kv_bytes, 1024)
    assert named in str(e.value)
