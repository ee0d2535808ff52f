"""`stepserve sweep`'s job: vary settings or load on the simulator (or the load on a live
server), find the knee, write a result JSON and an HTML report. Ctrl-C keeps the points
measured: the result is written, marked interrupted, exit status 130. The options are
checked before any point runs (a typo in an SLO would be silently never met)."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from stepserve.bench.job import EXIT_INTERRUPTED
from stepserve.bench.workload_options import BenchError
from stepserve.config.errors import UsageError, report_error
from stepserve.config.load import ConfigOverrides, load_config
from stepserve.config.settings import ConfigError, EngineConfig
from stepserve.config.urls import check_http_url
from stepserve.config.user_files import (
    OutputFile,
    check_output_dir,
    check_output_file,
    write_outputs,
)
from stepserve.metrics.rules import findings_for
from stepserve.metrics.run_summary import allowed as metric_range
from stepserve.metrics.summary import LATENCIES
from stepserve.routing.pools import load_pools_file
from stepserve.sim.cost import CostModel
from stepserve.sim.cost_options import CostModelOptions, cost_setup_for, with_cost
from stepserve.sim.job import changed_name, changed_settings
from stepserve.sim.run import plan_runs
from stepserve.sim.scenarios import RunSpec, Scenario, get_scenario
from stepserve.sim.target_settings import NO_LAYERS, Note, TargetLayers, grouped, target_layers
from stepserve.sweep.knee import (
    MAX_P99_RISE,
    MIN_THROUGHPUT_GAIN,
    NOISE_MARGIN,
    P99_METRIC,
    KneeRule,
    analyze_runs,
)
from stepserve.sweep.points import (
    MIN_SPAN_S,
    LiveOptions,
    predict_points,
    run_points,
    run_target_points,
    sized_workload,
    stderr_log,
    timed_workload,
)
from stepserve.sweep.report import format_knees, write_report
from stepserve.sweep.result import SweepPointResult, SweepResult
from stepserve.sweep.spec import (
    WORKLOAD_AXES,
    Axis,
    SweepPoint,
    build_points,
    parse_summary_slo,
    parse_vary,
)
from stepserve.sweep.window import STEADY, WindowRule
from stepserve.workload.errors import WorkloadError
from stepserve.workload.loader import load_workload
from stepserve.workload.overrides import WorkloadOverrides, override_workload
from stepserve.workload.spec import Workload

DEFAULT_REQUESTS = 600


@dataclass(frozen=True)
class SweepOptions:
    """One sweep. The workload: exactly one of `scenario` or `workload` (a YAML file).
    The runs (configs): `configs` files, or a scenario's own runs (`scenario_runs`: "" all,
    or names "A,B"), or the one run `config` makes for a workload file; `config` also goes
    on top of a scenario's runs, and its settings on top of each `configs` file. `vary`:
    the axes, `NAME=V1,V2,...`. `live`: sweep a live server's load instead."""

    scenario: str | None = None
    workload: str | None = None
    configs: tuple[str, ...] | None = None
    scenario_runs: str | None = None
    vary: tuple[str, ...] = ()
    requests: int | None = None  # None: DEFAULT_REQUESTS, more where a rate needs them
    duration_s: float | None = None
    seed: int | None = None
    config: ConfigOverrides = ConfigOverrides()
    slo: tuple[str, ...] = ()  # summary limits, e.g. "ttft_p99_s=2"
    min_throughput_gain: float = MIN_THROUGHPUT_GAIN
    max_p99_rise: float = MAX_P99_RISE
    p99_metric: str = P99_METRIC
    cost: CostModelOptions = CostModelOptions()
    live: LiveOptions | None = None
    json_out: str | None = None
    report: str | None = None  # a folder for the HTML report
    quiet: bool = False
    pools: str | None = None  # a pools file: every point becomes that deployment
    predict: str | None = None  # a cost file: the live points again on the simulator
    window: WindowRule = STEADY  # each point measured in its steady state, or whole
    rate: float | None = None  # a fixed offered rate for every point (req/s)
    noise_margin: float = NOISE_MARGIN


@dataclass(frozen=True)
class SweepPlan:
    """Everything but the runs: the points, their load, the cost model and KV sizing
    (None against a live target)."""

    name: str
    description: str
    cost: CostModel | None
    blocks: Callable[[EngineConfig], int] | None
    make_workload: Callable[[WorkloadOverrides], Workload]
    axes: list[Axis]
    x_axis: str
    points: list[SweepPoint]
    pools: Mapping[str, Any] | None = None  # the pools file's contents (simulator only)


def check_live_sweep(options: SweepOptions, axes: list[Axis]) -> None:
    """ValueError for what a live server cannot take."""
    assert options.live is not None
    check_http_url("--target", options.live.target)
    if options.configs:
        raise ValueError("--configs: a live server runs its own config; sweep configs on "
                         "the simulator, or start one server per config and sweep each")
    if options.scenario_runs is not None:
        raise ValueError("--scenario-runs: a live server runs its own config; with "
                         "--target the scenario gives only the workload")
    if options.pools:
        raise ValueError("--pools: a live server runs its own deployment; start it with "
                         "`stepserve serve --pools FILE` and sweep its load")
    if options.config.given and not options.predict:
        named = ", ".join(["--config"] * bool(options.config.config_file)
                          + sorted(options.config.settings))
        raise ValueError(f"{named}: engine settings cannot be changed on a live server; "
                         "restart it with them (`stepserve serve ...`)")
    fixed = [a.name for a in axes if a.name not in WORKLOAD_AXES]
    if fixed:
        raise ValueError(f"--vary {', '.join(fixed)}: a live server's settings cannot be "
                         f"varied; with --target vary only {', '.join(sorted(WORKLOAD_AXES))}")
    if not axes:
        raise ValueError("--target needs --vary rate=... (or concurrency=...): the load "
                         "is what a live sweep varies")
    warmup = options.live.warmup
    requests = options.requests or DEFAULT_REQUESTS
    if warmup < 0 or warmup >= requests:
        raise ValueError(f"--warmup {warmup}: must be >= 0 and below --requests "
                         f"({requests})")


def check_knee_options(options: SweepOptions) -> None:
    """The p99 metric names a latency the summaries have; each SLO limit is a value its
    metric can take (a NaN or negative latency would never be met, silently)."""
    latencies = [f"{name}_{stat}_s" for name in LATENCIES for stat in ("mean", "p50", "p95", "p99")]
    if options.p99_metric not in latencies:
        raise UsageError(f"--p99-metric {options.p99_metric!r}: unknown; allowed: "
                         f"{', '.join(latencies)}")
    for text in options.slo:
        try:
            slo = parse_summary_slo(text)
        except ValueError as e:
            raise UsageError(str(e)) from None
        problem = metric_range(slo.metric).problem(f"--slo {slo.metric}: limit", slo.limit)
        if problem is not None:
            raise UsageError(problem)


def _scenario_runs(scenario: Scenario, options: SweepOptions,
                   layers: TargetLayers = NO_LAYERS) -> list[RunSpec]:
    wanted = [n for n in (options.scenario_runs or "").split(",") if n]
    runs = [r for r in scenario.runs if not wanted or r.name in wanted]
    if wanted and len(runs) != len(wanted):
        known = ", ".join(r.name for r in scenario.runs)
        raise ValueError(f"--scenario-runs {options.scenario_runs}: {scenario.name} has "
                         f"{known}")
    # a run the engine flags change is no longer the scenario's: its name says so (the
    # engine kind's and a target profile's settings beneath it are said on stderr)
    out, notes = [], []
    for r in runs:
        config, run_notes = layers.config_for(r.config, options.config, r.name)
        before = layers.config_for(r.config, ConfigOverrides(), r.name)[0] \
            if layers.active else r.config
        out.append(RunSpec(changed_name(r.name, changed_settings(before, config)), config,
                           r.note))
        notes += run_notes
    _say_target(layers, notes)
    return out


def _file_runs(options: SweepOptions, layers: TargetLayers = NO_LAYERS) -> list[RunSpec]:
    """Each --configs file with the settings given on top (not --config)."""
    flags = replace(options.config, config_file=None)
    out, notes = [], []
    for f in options.configs or ():
        config, run_notes = layers.config_for(load_config(f), flags, Path(f).stem)
        out.append(RunSpec(Path(f).stem, config, f))
        notes += run_notes
    _say_target(layers, notes)
    return out


def _say_target(layers: TargetLayers, notes: list[Note]) -> None:
    """On stderr (stdout is the knee table): the engine kind, and what each run took
    from the target profile."""
    if layers.active:
        for line in layers.describe() + grouped(notes):
            print(line, file=sys.stderr)


def build_sweep(options: SweepOptions) -> SweepPlan:
    """Everything but the runs: points, load, cost model (None against a live target)."""
    axes = [parse_vary(v) for v in options.vary]
    live = options.live
    if options.predict and not live:
        raise ValueError("--predict FILE compares a live sweep (--target URL) with the "
                         "simulator; to sweep the simulator alone, use --cost FILE")
    if live:
        check_live_sweep(options, axes)
    if options.rate is not None and any(a.name == "rate" for a in axes):
        raise ValueError("--rate and --vary rate=... exclude each other: --rate fixes the "
                         "offered rate of every point, --vary rate sweeps it")
    base_load = WorkloadOverrides(num_requests=options.requests or DEFAULT_REQUESTS,
                                  seed=options.seed, rate=options.rate)
    # A steady window needs a span of arrivals: unless the size was given, a simulated
    # point at a high rate gets more than the default count (points.sized_workload).
    min_span = MIN_SPAN_S if options.requests is None and options.duration_s is None \
        and not live else None
    runs: list[RunSpec] = []
    cost: CostModel | None = None
    blocks: Callable[[EngineConfig], int] | None = None
    if options.scenario:
        scenario = get_scenario(options.scenario)
        if options.workload:
            raise ValueError("--scenario and --workload exclude each other")
        if not live:
            setup = cost_setup_for(options.cost) if options.cost.cost is not None else None
            layers = setup.layers if setup else target_layers(options.cost.engine_kind, None)
            runs = _file_runs(options, layers) if options.configs else \
                _scenario_runs(scenario, options, layers)
            if setup is not None:  # --cost given: it replaces the scenario's own
                scenario = with_cost(scenario, setup)
            cost, blocks = scenario.cost_model(), scenario.num_gpu_blocks
        source: Callable[[WorkloadOverrides], Workload] = scenario.workload_with
        name, description = scenario.name, scenario.description
    else:
        if options.scenario_runs is not None:
            raise ValueError("--scenario-runs needs --scenario")
        if not live:
            setup = cost_setup_for(options.cost)
            if options.configs:
                runs = _file_runs(options, setup.layers)
            else:
                config, notes = setup.layers.config_for(EngineConfig(), options.config)
                config_name = config.scheduler.batching
                runs = [RunSpec(config_name, config)]
                _say_target(setup.layers, [(config_name, t) for _, t in notes])
            cost, blocks = setup.cost_model, setup.num_gpu_blocks
    if live:
        # one series, named after the target; its config is unused
        x_axis, points = build_points([RunSpec("server", EngineConfig(), live.target)], axes)
    else:
        x_axis, points = build_points(runs, axes)
    pools = None
    if options.pools and not live:
        pools = load_pools_file(options.pools, options.config.apply())
    if blocks is not None:  # every point's KV pool, before any is run or a file read
        plan_runs([RunSpec(p.label, p.config) for p in points], blocks, pools)
    if options.workload:
        workload = load_workload(options.workload)
        source = functools.partial(override_workload, workload)
        name, description = workload.name, f"workload {options.workload}"
    if live:
        description += f", against the live server {live.target}"

    def make_workload(load: WorkloadOverrides) -> Workload:
        return timed_workload(sized_workload(source(base_load.merged(load)), min_span),
                              options.duration_s, live=bool(live))

    return SweepPlan(name, description, cost, blocks, make_workload, axes, x_axis, points, pools)


def sweep_result(plan: SweepPlan, runs: list[SweepPointResult], options: SweepOptions,
                 stopped: str | None = None) -> SweepResult:
    """The result; `stopped` says why it ended early ("interrupted", or the error that
    stopped a live sweep), None when every point ran."""
    rule = KneeRule(options.min_throughput_gain, options.max_p99_rise, options.p99_metric,
                    [parse_summary_slo(s) for s in options.slo], options.noise_margin)
    return SweepResult(
        scenario=plan.name, description=plan.description,
        cost_model=plan.cost.describe() if plan.cost else
        (f"predicted with {options.predict}" if options.predict else None),
        target=options.live.target if options.live else "sim",
        requests_per_point=options.requests or DEFAULT_REQUESTS,
        duration_s_per_point=options.duration_s,
        stopped=stopped, x_axis=plan.x_axis, axes=plan.axes,
        knee_rule=rule,
        runs=runs, knees=analyze_runs(runs, rule, plan.x_axis), findings=findings_for(runs),
        window=None if options.live else options.window)


def run_sweep(options: SweepOptions) -> int:
    """Run the sweep, print the knees, write the JSON and the report; the exit status."""
    check_knee_options(options)
    check_output_file("--json", options.json_out)  # before the sweep: keep its result
    check_output_dir("--report", options.report)
    try:
        plan = build_sweep(options)
        log = None if options.quiet else stderr_log
        if options.live:
            runs, stopped = run_target_points(options.live, plan.points, plan.make_workload,
                                              options.duration_s, log)
            if options.predict and runs:
                runs += predict_points(options.predict, options.config.apply(),
                                       plan.points, runs, plan.make_workload, log)
        else:
            assert plan.cost is not None and plan.blocks is not None
            runs, stopped = run_points(plan.points, plan.make_workload, plan.cost,
                                       plan.blocks, log, plan.pools, options.window)
        result = sweep_result(plan, runs, options, stopped)
    except (BenchError, ConfigError, WorkloadError, ValueError, OSError) as e:
        return report_error(e)
    if not runs:
        print("interrupted before the first point ended: nothing to report", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(format_knees(result))
    if options.json_out or options.report:
        print()
    failed = write_outputs([
        OutputFile.text("--json", options.json_out,
                        lambda: json.dumps(result.to_json(), indent=1)),
        OutputFile("--report", options.report, lambda out: write_report(result, out))])
    if stopped is not None:
        print(f"{stopped}: {len(runs)} of {len(plan.points)} points measured; the "
              "result above and any files written are partial", file=sys.stderr)
    if failed:
        report_error(failed)
    if stopped is not None:
        return EXIT_INTERRUPTED if stopped == "interrupted" else 2
    return 2 if failed else 0

