"""The cost model a user picks (`--cost constant|roofline|FILE`, `--step-ms`,
`--hardware`, `--model-spec`), and the KV memory it implies: a roofline model's hardware
minus weights, a cost file's profiled budget, or (constant) the config's own pool. A
cost file measured on another machine is used with a warning naming both.

A target profile (`profile --target`) as the cost file brings more than its cost part:
its inferred settings and engine kind (`--engine-kind`, sim/target_settings.py) and
its measured spread (sim/spread.py: each step's time drawn around the model's, seeded
by `--spread-seed`; `--no-spread` keeps the model's times).
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass, replace

from stepserve.config.errors import UsageError
from stepserve.config.settings import EngineConfig
from stepserve.config.user_files import load_json
from stepserve.plan.model_specs import get_model_spec
from stepserve.sim.calibrated import TARGET_PROFILE_SCHEMA, CalibratedCost
from stepserve.sim.cost import ConstantCost, CostModel
from stepserve.sim.roofline import RooflineCost, get_hardware
from stepserve.sim.scenarios import Scenario, num_gpu_blocks_for
from stepserve.sim.spread import HttpFloor, Spread, SpreadCost
from stepserve.sim.target_settings import (
    NO_LAYERS,
    ProfileSettings,
    TargetLayers,
    target_layers,
)


@dataclass(frozen=True)
class CostModelOptions:
    """`cost`: "constant" (`step_ms`), "roofline" (`hardware`, `model_spec`) or a cost
    file's path; None: roofline, unless a scenario brings its own."""

    cost: str | None = None
    step_ms: float = 25.0
    hardware: str = "h100"
    model_spec: str = "llama-3-8b"
    engine_kind: str | None = None  # None: a target profile's engine, else stepserve
    spread_seed: int = 0
    no_spread: bool = False


@dataclass(frozen=True)
class CostSetup:
    """A cost model and the KV size it implies (None for a constant model)."""

    cost_model: CostModel
    kv_cache_bytes: int | None = None
    kv_bytes_per_token: int | None = None
    layers: TargetLayers = NO_LAYERS  # the engine kind and profile under each run
    http_floor: HttpFloor | None = None  # a target's HTTP path, for client latencies
    spread_seed: int = 0

    def num_gpu_blocks(self, config: EngineConfig) -> int:
        return num_gpu_blocks_for(config, self.kv_cache_bytes, self.kv_bytes_per_token)


NAMED = ("constant", "roofline")


def with_cost(scenario: Scenario, setup: CostSetup) -> Scenario:
    """`scenario` with another cost model and the KV pool it implies."""
    return replace(scenario, cost_model=lambda: setup.cost_model,
                   kv_cache_bytes=setup.kv_cache_bytes,
                   kv_bytes_per_token=setup.kv_bytes_per_token)


def cost_setup_for(options: CostModelOptions) -> CostSetup:
    """The cost model `options` name; UsageError for an unknown preset or a bad file."""
    if options.cost is not None and options.cost not in NAMED:
        return _file_setup(options)
    layers = target_layers(options.engine_kind, None)
    if options.cost == "constant":
        return CostSetup(ConstantCost(options.step_ms / 1000.0), layers=layers)
    try:
        model = get_model_spec(options.model_spec)
    except ValueError as e:
        raise UsageError(f"--model-spec: {e}") from None
    try:
        hardware = get_hardware(options.hardware)
    except ValueError as e:
        raise UsageError(f"--hardware: {e}") from None
    cost = RooflineCost(hardware, model)
    return CostSetup(cost, cost.kv_cache_bytes(), model.kv_bytes_per_token, layers)


def layers_for(options: CostModelOptions) -> TargetLayers:
    """The engine kind and profile under a scenario's runs, whose cost model is its own
    unless --cost is given."""
    if options.cost is not None:
        return cost_setup_for(options).layers
    return target_layers(options.engine_kind, None)


def _file_setup(options: CostModelOptions) -> CostSetup:
    """A cost file; a target profile's settings, kind and spread with it."""
    assert options.cost is not None
    path = options.cost
    data = load_json(path, "cost file")
    data = data if isinstance(data, dict) else {}
    cost: CostModel = load_cost_file(path, data)
    profile = spread = None
    if data.get("schema") == TARGET_PROFILE_SCHEMA:
        try:
            profile = ProfileSettings.from_json(f"profile {path}", data)
            spread = Spread.from_json(data.get("spread"))  # checked even if unused
        except ValueError as e:
            raise UsageError(f"--cost {path!r}: {e}") from None
        spread = None if options.no_spread else spread
    meta = cost.meta  # type: ignore[attr-defined]
    if spread is not None and spread.step is not None:
        cost = SpreadCost(cost, spread.step.factors, options.spread_seed)
    return CostSetup(cost, meta.get("kv_cache_bytes"), meta.get("kv_bytes_per_token"),
                     target_layers(options.engine_kind, profile),
                     spread.http if spread is not None else None, options.spread_seed)


def load_cost_file(path: str, data: object = None) -> CalibratedCost:
    """A cost file (`data`: its JSON, already read); its warnings (another machine) go
    to stderr."""
    if data is None:
        data = load_json(path, "cost file")
    try:
        cost = CalibratedCost.from_json(data if isinstance(data, dict) else {})
    except ValueError as e:
        raise UsageError(f"--cost {path!r}: {e}") from None
    for warning in cost_file_warnings(cost):
        print(f"warning: --cost {path}: {warning}", file=sys.stderr)
    return cost


def cost_file_warnings(cost: CalibratedCost, model: str | None = None) -> list[str]:
    """What differs between where the cost was measured and here (machine, model)."""
    out = []
    measured_on, here = cost.meta.get("host"), this_host()
    if measured_on and measured_on != here:
        out.append(f"measured on {measured_on}, not on this machine ({here}): its step "
                   f"times are that machine's")
    measured_for = cost.meta.get("model")
    if model is not None and measured_for and measured_for != model:
        out.append(f"measured for model {measured_for!r}, not {model!r}")
    return out


def this_host() -> str:
    """This machine as a cost file names it: the CPU model and its core count."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu} x {os.cpu_count()} cores"
