"""`stepserve simulate`'s job: a scenario, a workload file or a trace with a config and
settings, through the real scheduler on a virtual clock; the table printed, the result
written as JSON. User mistakes raise UsageError (one line, exit 2); the output path is
checked before anything runs."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from typing import Any

from tqdm import tqdm

from stepserve.config.errors import UsageError, report_error
from stepserve.config.load import ConfigOverrides, config_fields
from stepserve.config.settings import EngineConfig
from stepserve.config.user_files import OutputFile, check_output_file, write_outputs
from stepserve.routing.pools import load_pools_file
from stepserve.sim.cost_options import CostModelOptions, cost_setup_for, with_cost
from stepserve.sim.report import format_result
from stepserve.sim.run import (
    SimulateResult,
    plan_runs,
    run_all,
    run_scenario,
    selected_runs,
)
from stepserve.sim.scenarios import RunSpec, Scenario, get_scenario
from stepserve.sim.target_settings import (
    NO_LAYERS,
    Note,
    TargetLayers,
    grouped,
    target_layers,
)
from stepserve.workload.loader import TraceOptions, load_workload, trace_workload
from stepserve.workload.overrides import WorkloadOverrides, override_workload


@dataclass(frozen=True)
class SimulateOptions:
    """One `simulate` of exactly one of `scenario`, `workload` (YAML) or `trace` (JSON
    Lines); `config` goes on top of a scenario's runs, or is a file's one run."""

    scenario: str | None = None
    workload: str | None = None
    trace: TraceOptions | None = None
    config: ConfigOverrides = ConfigOverrides()
    runs: tuple[str, ...] | None = None  # a scenario's runs to do; None: all
    overrides: WorkloadOverrides = WorkloadOverrides()
    cost: CostModelOptions = CostModelOptions()
    json_out: str | None = None
    pools: str | None = None  # a pools file: every run becomes that deployment
    progress: bool = True  # a progress bar on stderr, when it is a terminal


def run_simulate(options: SimulateOptions) -> int:
    """Simulate, print the table, write the JSON; the exit status. Every flag, the config
    and each run's KV pool are checked before a workload file or trace is read."""
    check_output_file("--json", options.json_out)  # before the run: a typo must not cost it
    progress = _progress_factory(options.progress and sys.stderr.isatty())
    pools = load_pools_file(options.pools, options.config.apply()) if options.pools else None
    if options.scenario:
        scenario = selected_runs(get_scenario(options.scenario), options.runs)
        # --cost given: it replaces the scenario's own
        setup = cost_setup_for(options.cost) if options.cost.cost is not None else None
        layers = setup.layers if setup else target_layers(options.cost.engine_kind, None)
        changes, notes = None, []  # type: ignore[var-annotated]
        if options.config.given or layers.active:
            scenario, changes, notes = override_runs(scenario, options.config, layers)
        if setup is not None:
            scenario = with_cost(scenario, setup)
        result = run_scenario(scenario, options.overrides, None, progress, pools)
        if options.config.given and changes is not None:  # once the runs are allowed
            for line in describe_changes(changes):
                print(line)
        _print_target(layers, notes)
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
    """A workload file or a trace, one run with the config file and settings; the run
    (its config, cost model and KV pool) planned before the file is read."""
    config = options.config.apply()
    name = config.scheduler.batching
    kind = "trace" if options.trace is not None else "workload file"
    if options.runs is not None and options.runs != (name,):
        raise UsageError(f"--runs {','.join(options.runs)}: a {kind} makes one "
                         f"run, {name} (its batching); allowed: {name}, or no --runs")
    setup = cost_setup_for(options.cost)
    config, notes = setup.layers.config_for(EngineConfig(), options.config, name)
    planned = plan_runs((RunSpec(name, config),), setup.num_gpu_blocks, pools)
    if options.trace is not None:
        workload = trace_workload(options.trace)
        source = f"trace {options.trace.path}"
    else:
        assert options.workload is not None
        workload = load_workload(options.workload)
        source = f"workload {options.workload}"
    workload = override_workload(workload, options.overrides)
    _print_target(setup.layers, notes)
    return run_all(workload.name, source, workload, workload.generate(), planned,
                   setup.cost_model, False, progress)


Changes = dict[str, tuple[Any, Any]]  # setting -> (the run's value, the value given)


def changed_settings(before: EngineConfig, after: EngineConfig) -> Changes:
    """The settings whose values differ, in config order."""
    def value(config: EngineConfig, section: str, name: str) -> Any:
        return getattr(getattr(config, section) if section else config, name)

    return {f.name: (value(before, section, f.name), value(after, section, f.name))
            for section, f in config_fields()
            if value(before, section, f.name) != value(after, section, f.name)}


def override_runs(scenario: Scenario, config: ConfigOverrides,
                  layers: TargetLayers = NO_LAYERS
                  ) -> tuple[Scenario, dict[str, Changes], list[Note]]:
    """The config and settings on every run of a scenario, over the engine kind and
    target profile beneath it (`layers`); a run the command line changed says so in its
    name ("after (max_num_seqs=64)"). Also the command line's changes by each run's own
    name, and the notes on what came from the target."""
    runs, changes, notes = [], {}, []  # type: ignore[var-annotated]
    for r in scenario.runs:
        new, run_notes = layers.config_for(r.config, config, r.name)
        before = layers.config_for(r.config, ConfigOverrides(), r.name)[0] \
            if layers.active else r.config
        changed = changed_settings(before, new)
        changes[r.name] = changed
        notes += run_notes
        runs.append(RunSpec(changed_name(r.name, changed), new, r.note))
    return replace(scenario, runs=tuple(runs)), changes, notes


def _print_target(layers: TargetLayers, notes: list[Note]) -> None:
    """Which settings came from the engine kind and the target profile."""
    if not layers.active:
        return
    for line in layers.describe():
        print(line)
    if layers.profile is not None:
        print(f"settings from {layers.profile.source} (confidence in brackets):")
        for line in grouped(notes):
            print(line)
    print()


def changed_name(name: str, changed: Changes, shown: int = 2) -> str:
    """`after (max_num_seqs=64)`: a run's name with up to `shown` changed settings."""
    if not changed:
        return name
    items = [f"{k}={_text(new)}" for k, (_old, new) in changed.items()]
    more = f", +{len(items) - shown} more" if len(items) > shown else ""
    return f"{name} ({', '.join(items[:shown])}{more})"


def describe_changes(changes: dict[str, Changes]) -> list[str]:
    """Which of each run's settings the command line overrode, and its name now."""
    lines = ["settings from the command line over the scenario's runs:"]
    for run, changed in changes.items():
        what = "; ".join(f"{k} {_text(old)} -> {_text(new)}"
                         for k, (old, new) in changed.items())
        lines.append(f"  {run}: {what} (run named {changed_name(run, changed)!r})"
                     if changed else f"  {run}: none changed")
    return lines + [""]


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
