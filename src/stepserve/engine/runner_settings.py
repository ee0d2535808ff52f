"""An engine's settings once its model is loaded: the user's settings on the hardware's
scheduling defaults (host/step_budget.py; only where settings, not a complete EngineConfig,
were given), max_model_len within what the model allows, and the CPU block pool the
runner actually sized (swap_space turns into a block count)."""

from __future__ import annotations

import logging

from stepserve.config.load import ConfigOverrides
from stepserve.config.settings import ConfigError, EngineConfig
from stepserve.host.step_budget import (
    StepBudget,
    cpu_step_budget,
    hardware_base,
    prefill_params,
    runner_hardware,
)

log = logging.getLogger("stepserve.engine")


def settings_for_runner(config: EngineConfig, overrides: ConfigOverrides | None, runner,
                        strict_max_model_len: bool) -> tuple[EngineConfig, StepBudget | None]:
    """`config`: the settings as applied on the plain defaults; `overrides`: the user's
    settings (None: `config` is complete and used as it is). A max_model_len beyond the
    model's is lowered to it, or with `strict_max_model_len` refused (ConfigError)."""
    budget = None
    if overrides is not None:
        budget = cpu_step_budget(runner_hardware(runner), prefill_params(runner.args))
        config = overrides.apply(hardware_base(budget, config))
        if budget is not None:
            log.info("CPU scheduling defaults: %s", budget.describe())
    limit = runner.args.max_position_embeddings
    if limit and config.scheduler.max_model_len > limit:
        if strict_max_model_len:
            raise ConfigError(
                f"max_model_len = {config.scheduler.max_model_len} is more than the model "
                f"allows: {limit} (max_position_embeddings in its config.json); lower "
                "max_model_len (--max-model-len)")
        config = config.replace(max_model_len=limit)  # the model cannot go further
    if runner.num_cpu_blocks != config.cache.num_cpu_blocks:  # sized by swap_space
        config = config.replace(num_cpu_blocks=runner.num_cpu_blocks, swap_space=0.0)
    return config, budget
