"""`stepserve simulate`: a built-in scenario, or a workload file with a config file and
flags, through the real scheduler on a virtual clock."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

from stepserve.config import ConfigError
from stepserve.config_load import add_config_arguments, config_from_args
from stepserve.plan.model_specs import get_model_spec
from stepserve.sim.cost import ConstantCost, CostModel
from stepserve.sim.hardware import get_hardware
from stepserve.sim.roofline import RooflineCost
from stepserve.sim.run import run_all, run_scenario, to_json_ready
from stepserve.sim.scenarios import SCENARIOS, RunSpec, Scenario, get_scenario
from stepserve.sim.table import format_result
from stepserve.workload.errors import WorkloadError
from stepserve.workload.loader import load_workload


def add_simulate_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "simulate", help="run the real scheduler on a virtual clock with a cost model",
        description="Simulate a built-in scenario (--scenario) or your own workload "
                    "(--workload FILE, with --config FILE and/or vLLM-style flags).")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--scenario", choices=sorted(SCENARIOS), help="a built-in scenario")
    src.add_argument("--workload", help="a workload YAML file (see docs/guide.md)")
    p.add_argument("--config", help="engine config YAML (seed shape: scheduler:, queue:, ...)")
    p.add_argument("--runs", help="scenario runs to do, comma-separated (default: all)")
    p.add_argument("--requests", type=int, help="override the number of requests")
    p.add_argument("--rate", type=float, help="override the arrival rate (req/s)")
    p.add_argument("--seed", type=int, help="override the workload seed")
    add_cost_model_arguments(p, default=None)
    p.add_argument("--json", metavar="OUT", help="also write the result as JSON to OUT")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_config_arguments(p)
    p.set_defaults(func=run_simulate)
    return p


def add_cost_model_arguments(p, default: str | None = "roofline") -> None:
    """--cost, --step-ms, --hardware, --model-spec: shared by simulate, sweep and bench."""
    p.add_argument("--cost", choices=["constant", "roofline"], default=default,
                   help="cost model (a scenario brings its own; otherwise roofline)")
    p.add_argument("--step-ms", type=float, default=25.0, help="constant cost: ms per step")
    p.add_argument("--hardware", default="h100", help="roofline: hardware preset")
    p.add_argument("--model-spec", default="llama-3-8b", help="roofline: model preset")


def _progress_factory(enabled: bool):
    if not enabled:
        return None

    def make(name: str, total: int):
        bar = tqdm(total=total, desc=f"simulating {name}", unit="req", leave=False,
                   file=sys.stderr, mininterval=0.5)
        return bar.update

    return make


def _cost_model(args) -> tuple[CostModel, int | None]:
    if args.cost == "constant":
        return ConstantCost(args.step_ms / 1000.0), None
    model = get_model_spec(args.model_spec)
    cost = RooflineCost(get_hardware(args.hardware), model)
    return cost, model.kv_bytes_per_token


def run_simulate(args: argparse.Namespace) -> int:
    overrides = {k: v for k, v in (("num_requests", args.requests), ("rate", args.rate),
                                   ("seed", args.seed)) if v is not None}
    progress = _progress_factory(not args.no_progress and sys.stderr.isatty())
    try:
        if args.scenario:
            scenario = get_scenario(args.scenario)
            if args.config or any(getattr(args, a, None) is not None for a in _flag_names(args)):
                scenario = _override_runs(scenario, args)
            only = args.runs.split(",") if args.runs else None
            result = run_scenario(scenario, overrides, only, progress)
        else:
            workload = load_workload(args.workload)
            if overrides:
                workload = _with(workload, overrides)
            config = config_from_args(args)
            cost, bpt = _cost_model(args)
            specs = workload.generate()
            scenario = Scenario(workload.name, f"workload {args.workload}", lambda **kw: workload,
                                lambda: cost, (RunSpec(config.scheduler.batching, config),),
                                kv_cache_bytes=getattr(cost, "kv_cache_bytes", lambda: None)(),
                                kv_bytes_per_token=bpt)
            result = run_all(workload.name, scenario.description, workload, specs,
                             scenario.runs, cost, scenario.num_gpu_blocks, False, progress)
    except (ConfigError, WorkloadError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_result(result))
    if args.json:
        Path(args.json).write_text(json.dumps(to_json_ready(result), indent=2))
        print(f"\nwrote {args.json}")
    return 0


def _flag_names(args) -> list[str]:
    from stepserve.config_load import _fields_with_meta

    return [f.name for _s, f in _fields_with_meta()]


def _override_runs(scenario: Scenario, args) -> Scenario:
    """Apply --config and flags on top of every run of a scenario."""
    from dataclasses import replace

    runs = tuple(RunSpec(r.name, config_from_args(args, r.config), r.note) for r in scenario.runs)
    return replace(scenario, runs=runs)


def _with(workload, overrides: dict):
    from dataclasses import replace

    from stepserve.workload.arrivals import Poisson

    changes = {}
    if "num_requests" in overrides:
        changes["num_requests"] = overrides["num_requests"]
    if "seed" in overrides:
        changes["seed"] = overrides["seed"]
    if "rate" in overrides:
        if not isinstance(workload.arrival, Poisson):
            raise ValueError("--rate applies to Poisson workloads only")
        changes["arrival"] = Poisson(overrides["rate"])
    return replace(workload, **changes)
