"""The cost model a user picks by name (`--cost`, `--step-ms`, `--hardware`,
`--model-spec`), and the KV memory it implies.

A roofline model knows the memory its hardware leaves for KV after the weights and the
model's KV bytes per token, so it sizes the KV pool (sim/kv_sizing.py); a constant one
leaves the pool to the config."""

from __future__ import annotations

from dataclasses import dataclass

from stepserve.cli_errors import UsageError
from stepserve.config import EngineConfig
from stepserve.plan.model_specs import get_model_spec
from stepserve.sim.cost import ConstantCost, CostModel
from stepserve.sim.hardware import get_hardware
from stepserve.sim.kv_sizing import num_gpu_blocks_for
from stepserve.sim.roofline import RooflineCost


@dataclass(frozen=True)
class CostModelOptions:
    """Which cost model: `cost` "constant" (`step_ms` a step) or "roofline" (`hardware`
    and `model_spec` presets); None: roofline, unless a scenario brings its own."""

    cost: str | None = None
    step_ms: float = 25.0
    hardware: str = "h100"
    model_spec: str = "llama-3-8b"


@dataclass(frozen=True)
class CostSetup:
    """A cost model and the KV size it implies (None for a constant model)."""

    cost_model: CostModel
    kv_cache_bytes: int | None = None
    kv_bytes_per_token: int | None = None

    def num_gpu_blocks(self, config: EngineConfig) -> int:
        return num_gpu_blocks_for(config, self.kv_cache_bytes, self.kv_bytes_per_token)


def cost_setup_for(options: CostModelOptions) -> CostSetup:
    """The cost model `options` name; UsageError for a preset the lookups do not know."""
    if options.cost == "constant":
        return CostSetup(ConstantCost(options.step_ms / 1000.0))
    try:
        model = get_model_spec(options.model_spec)
    except ValueError as e:
        raise UsageError(f"--model-spec: {e}") from None
    try:
        hardware = get_hardware(options.hardware)
    except ValueError as e:
        raise UsageError(f"--hardware: {e}") from None
    cost = RooflineCost(hardware, model)
    return CostSetup(cost, cost.kv_cache_bytes(), model.kv_bytes_per_token)
