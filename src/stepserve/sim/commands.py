"""`stepserve simulate`: a built-in scenario, or a workload file with a config file and
flags, through the real scheduler on a virtual clock.

User mistakes raise UsageError (ConfigError, WorkloadError), which `stepserve` prints as
one line, exit 2; the flags and the output path are checked before anything runs."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from stepserve.cli_errors import UsageError, reports_usage_errors
from stepserve.config_load import add_config_arguments, config_from_args, flag_changes
from stepserve.limits import RATE, REQUESTS, SEED, STEP_MS, check_flags
from stepserve.plan.model_specs import get_model_spec
from stepserve.sim.cost import ConstantCost, CostModel
from stepserve.sim.hardware import get_hardware
from stepserve.sim.roofline import RooflineCost
from stepserve.sim.run import run_all, run_scenario, to_json_ready
from stepserve.sim.scenarios import SCENARIOS, RunSpec, Scenario, get_scenario
from stepserve.sim.table import format_result
from stepserve.user_files import check_output_file
from stepserve.workload.arrivals import Poisson
from stepserve.workload.loader import load_workload
from stepserve.workload.spec import Workload

# Bounds of the numeric flags (limits.py); engine settings are bounded by config.py.
SIMULATE_FLAGS = {"requests": REQUESTS, "rate": RATE, "seed": SEED, "step_ms": STEP_MS}


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
    try:  # a preset name the lookups do not know is the user's mistake
        model = get_model_spec(args.model_spec)
    except ValueError as e:
        raise UsageError(f"--model-spec: {e}") from None
    try:
        hardware = get_hardware(args.hardware)
    except ValueError as e:
        raise UsageError(f"--hardware: {e}") from None
    return RooflineCost(hardware, model), model.kv_bytes_per_token


@reports_usage_errors
def run_simulate(args: argparse.Namespace) -> int:
    check_flags(args, SIMULATE_FLAGS)
    check_output_file("--json", args.json)  # before the run: a typo must not cost the result
    overrides = {k: v for k, v in (("num_requests", args.requests), ("rate", args.rate),
                                   ("seed", args.seed)) if v is not None}
    progress = _progress_factory(not args.no_progress and sys.stderr.isatty())
    if args.scenario:
        scenario = get_scenario(args.scenario)
        if args.config or flag_changes(args):
            scenario = _override_runs(scenario, args)
        only = args.runs.split(",") if args.runs else None
        result = run_scenario(scenario, overrides, only, progress)
    else:
        result = _run_workload(args, overrides, progress)
    print(format_result(result))
    if args.json:
        Path(args.json).write_text(json.dumps(to_json_ready(result), indent=2))
        print(f"\nwrote {args.json}")
    return 0


def _run_workload(args: argparse.Namespace, overrides: dict, progress) -> dict:
    """A workload file, one run with the config file and flags."""
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
    return run_all(workload.name, scenario.description, workload, specs, scenario.runs,
                   cost, scenario.num_gpu_blocks, False, progress)


def _override_runs(scenario: Scenario, args) -> Scenario:
    """Apply --config and flags on top of every run of a scenario."""
    runs = tuple(RunSpec(r.name, config_from_args(args, r.config), r.note) for r in scenario.runs)
    return replace(scenario, runs=runs)


def _with(workload: Workload, overrides: dict) -> Workload:
    changes = {}
    if "num_requests" in overrides:
        changes["num_requests"] = overrides["num_requests"]
    if "seed" in overrides:
        changes["seed"] = overrides["seed"]
    if "rate" in overrides:
        if not isinstance(workload.arrival, Poisson):
            raise UsageError(f"--rate applies to Poisson workloads only; {workload.name} has "
                             f"{workload.arrival.describe()}")
        changes["arrival"] = Poisson(overrides["rate"])
    return replace(workload, **changes)
