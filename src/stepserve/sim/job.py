"""`stepserve simulate`'s job: a built-in scenario, or a workload file with a config
file and settings, through the real scheduler on a virtual clock; the table printed,
the result written as JSON.

User mistakes raise UsageError (ConfigError, WorkloadError), which `stepserve` prints as
one line, exit 2; the output path is checked before anything runs."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace

from tqdm import tqdm

from stepserve.cli_errors import report_error
from stepserve.config_load import ConfigOverrides
from stepserve.routing.pools import load_pools_file
from stepserve.sim.cost_options import CostModelOptions, cost_setup_for, with_cost
from stepserve.sim.run import SimulateResult, run_all, run_scenario
from stepserve.sim.scenarios import RunSpec, Scenario, get_scenario
from stepserve.sim.table import format_result
from stepserve.user_files import OutputFile, check_output_file, write_outputs
from stepserve.workload.loader import load_workload
from stepserve.workload.overrides import WorkloadOverrides, override_workload


@dataclass(frozen=True)
class SimulateOptions:
    """One `simulate`: exactly one of `scenario` (a built-in name) or `workload` (a YAML
    file). `config` goes on top of every run of a scenario, or makes the one run of a
    workload file; `cost` is used for a workload file (a scenario brings its own)."""

    scenario: str | None = None
    workload: str | None = None
    config: ConfigOverrides = ConfigOverrides()
    runs: tuple[str, ...] | None = None  # a scenario's runs to do; None: all
    overrides: WorkloadOverrides = WorkloadOverrides()
    cost: CostModelOptions = CostModelOptions()
    json_out: str | None = None
    pools: str | None = None  # a pools file: every run becomes that deployment
    progress: bool = True  # a progress bar on stderr, when it is a terminal


def run_simulate(options: SimulateOptions) -> int:
    """Simulate, print the table, write the JSON; the exit status."""
    check_output_file("--json", options.json_out)  # before the run: a typo must not cost it
    progress = _progress_factory(options.progress and sys.stderr.isatty())
    pools = load_pools_file(options.pools, options.config.apply()) if options.pools else None
    if options.scenario:
        scenario = get_scenario(options.scenario)
        if options.config.given:
            scenario = _override_runs(scenario, options.config)
        if options.cost.cost is not None:  # --cost given: it replaces the scenario's own
            scenario = with_cost(scenario, cost_setup_for(options.cost))
        result = run_scenario(scenario, options.overrides, options.runs, progress, pools)
    else:
        result = _run_workload(options, progress, pools)
    print(format_result(result))
    if options.json_out:
        print()
    failed = write_outputs([OutputFile.text("--json", options.json_out,
                                            lambda: json.dumps(result.to_json(), indent=2))])
    return report_error(failed) if failed else 0


def _progress_factory(enabled: bool):
    if not enabled:
        return None

    def make(name: str, total: int):
        bar = tqdm(total=total, desc=f"simulating {name}", unit="req", leave=False,
                   file=sys.stderr, mininterval=0.5)
        return bar.update

    return make


def _run_workload(options: SimulateOptions, progress, pools) -> SimulateResult:
    """A workload file, one run with the config file and settings."""
    assert options.workload is not None
    workload = override_workload(load_workload(options.workload), options.overrides)
    config = options.config.apply()
    setup = cost_setup_for(options.cost)
    specs = workload.generate()
    runs = (RunSpec(config.scheduler.batching, config),)
    return run_all(workload.name, f"workload {options.workload}", workload, specs, runs,
                   setup.cost_model, setup.num_gpu_blocks, False, progress, pools)


def _override_runs(scenario: Scenario, config: ConfigOverrides) -> Scenario:
    """Apply the config file and settings on top of every run of a scenario."""
    runs = tuple(RunSpec(r.name, config.apply(r.config), r.note) for r in scenario.runs)
    return replace(scenario, runs=runs)
