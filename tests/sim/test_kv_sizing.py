"""KV blocks per simulated replica (num_gpu_blocks_for) and the cost model picked by name."""

from __future__ import annotations

import pytest

from stepserve.config.errors import UsageError
from stepserve.config.settings import EngineConfig
from stepserve.plan.model_specs import get_model_spec
from stepserve.sim.cost import ConstantCost
from stepserve.sim.cost_options import CostModelOptions, cost_setup_for
from stepserve.sim.roofline import RooflineCost
from stepserve.sim.scenarios import get_scenario, num_gpu_blocks_for

CONFIG = EngineConfig().replace(max_num_seqs=8, max_model_len=1024, block_size=16)


def test_the_configs_own_block_count_wins():
    config = CONFIG.replace(num_gpu_blocks=300)
    assert num_gpu_blocks_for(config, 10**9, 1024) == 300


def test_a_kv_size_gives_bytes_over_bytes_per_block():
    assert num_gpu_blocks_for(CONFIG, 16 * 1024 * 100 + 5, 1024) == 100


@pytest.mark.parametrize("kv_bytes, per_token", [(None, None), (0, 1024), (10**9, None)])
def test_without_a_kv_size_max_num_seqs_sequences_of_max_model_len_fit(kv_bytes, per_token):
    assert num_gpu_blocks_for(CONFIG, kv_bytes, per_token) == 8 * (1024 // 16) + 1


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
