"""`stepserve sweep`: vary settings or load on the simulator (or the load on a live server,
`--target URL`, see sweep/live.py), find the knee, write a result JSON and an HTML
report. Ctrl-C keeps the points already measured: the result is printed and written,
marked interrupted, and the exit status is 130."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from stepserve.bench.plan import BenchError
from stepserve.cli_errors import UsageError, report_error, reports_usage_errors
from stepserve.config import ConfigError
from stepserve.config_load import (
    add_config_arguments,
    config_from_args,
    flag_changes,
    load_config,
)
from stepserve.limits import REQUESTS, SECONDS, SEED, STEP_MS, Range, check_flags
from stepserve.metrics.alerts import findings_for
from stepserve.metrics.summary import LATENCIES
from stepserve.metrics.summary_checks import allowed as metric_range
from stepserve.sim.commands import _cost_model, add_cost_model_arguments
from stepserve.sim.scenarios import SCENARIOS, Scenario, get_scenario
from stepserve.sweep.knee import (
    MAX_P99_RISE,
    MIN_THROUGHPUT_GAIN,
    P99_METRIC,
    KneeResult,
    analyze_runs,
)
from stepserve.sweep.live import check_target_args, run_target_points, target_points
from stepserve.sweep.runner import override_workload, run_points, stderr_log, timed_workload
from stepserve.sweep.spec import RunConfig, build_points, parse_slo, parse_vary
from stepserve.sweep.text import format_knees
from stepserve.user_files import check_output_dir, check_output_file
from stepserve.workload.errors import WorkloadError
from stepserve.workload.loader import load_workload

DEFAULT_REQUESTS = 600
EXIT_INTERRUPTED = 130
# Bounds of the numeric flags (limits.py); engine settings are bounded by config.py.
# The knee's fractions: a gain of 10x or a rise of 1000x is no threshold at all.
SWEEP_FLAGS = {
    "requests": REQUESTS, "duration_s": SECONDS, "seed": SEED,
    "min_throughput_gain": Range(0.0, 10.0, float), "max_p99_rise": Range(0.0, 1000.0, float),
    "warmup": Range(0, REQUESTS.hi), "timeout_s": SECONDS,
    "metrics_interval_s": Range(0.0, 3600.0, float), "step_ms": STEP_MS,
}


def add_sweep_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "sweep", help="sweep configs or load (simulator or live server) and find the knee",
        description="Run one fixed request count per point on the simulator (or, with "
                    "--target, against a running server), find where throughput stops "
                    "rising while P99 climbs (the knee), and recommend the last point "
                    "before it that meets the SLO.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--scenario", choices=sorted(SCENARIOS),
                     help="built-in scenario: its workload, cost model and runs")
    src.add_argument("--workload", help="a workload YAML file")
    runs = p.add_mutually_exclusive_group()
    runs.add_argument("--configs", nargs="+", metavar="FILE",
                      help="engine config YAML files to compare (name: file stem)")
    runs.add_argument("--scenario-runs", nargs="?", const="", metavar="A,B,...",
                      help="use the scenario's own runs (all, or those named); the default "
                           "with --scenario")
    p.add_argument("--vary", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="a config setting (e.g. max_num_seqs=16,32,64) or workload option "
                        "(rate, seed, concurrency); repeat for a grid; the last is the x axis")
    p.add_argument("--requests", type=int, default=DEFAULT_REQUESTS,
                   help=f"requests per point (default {DEFAULT_REQUESTS})")
    p.add_argument("--duration-s", type=float, metavar="S",
                   help="run each point for S seconds of arrivals instead of a request "
                        "count (the seed: 5 minutes per config); open loop sends what the "
                        "rate brings in S; closed loop (--target only) stops issuing at S, "
                        "after at most --requests")
    p.add_argument("--seed", type=int, help="workload seed")
    p.add_argument("--config", help="base engine config YAML for --workload")
    p.add_argument("--slo", action="append", default=[], metavar="METRIC=LIMIT",
                   help="e.g. ttft_p99_s=2 (at most) or throughput_tokens_per_s>=1000")
    p.add_argument("--min-throughput-gain", type=float, default=MIN_THROUGHPUT_GAIN,
                   help="knee: throughput gains less than this vs the previous point "
                        f"(default {MIN_THROUGHPUT_GAIN})")
    p.add_argument("--max-p99-rise", type=float, default=MAX_P99_RISE,
                   help=f"knee: while P99 rises more than this (default {MAX_P99_RISE})")
    p.add_argument("--p99-metric", default=P99_METRIC,
                   help=f"the tail metric for the knee (default {P99_METRIC})")
    add_cost_model_arguments(p, default=None)
    live = p.add_argument_group("--target (a live OpenAI-compatible server)")
    live.add_argument("--target", metavar="URL",
                      help="sweep the load (--vary rate=... or concurrency=...) against this "
                           "server instead of the simulator; the workload comes from "
                           "--scenario or --workload")
    live.add_argument("--model", help="model name sent (default: the first of /v1/models)")
    live.add_argument("--warmup", type=int, default=0, metavar="N",
                      help="per point, the first N requests are excluded from the metrics")
    live.add_argument("--timeout-s", type=float, default=600.0, help="per-request timeout")
    live.add_argument("--metrics-interval-s", type=float, default=0.25,
                      help="how often to scrape the target's /metrics (0: never)")
    p.add_argument("--json", metavar="OUT", help="write the sweep result as JSON")
    p.add_argument("--report", metavar="DIR", help="write the HTML report and PNGs to DIR")
    p.add_argument("--quiet", action="store_true", help="no per-point progress lines")
    add_config_arguments(p)
    p.set_defaults(func=run_sweep_cmd)
    return p


def _scenario_runs(scenario: Scenario, args) -> list[RunConfig]:
    wanted = [n for n in (args.scenario_runs or "").split(",") if n]
    runs = [r for r in scenario.runs if not wanted or r.name in wanted]
    if wanted and len(runs) != len(wanted):
        known = ", ".join(r.name for r in scenario.runs)
        raise ValueError(f"--scenario-runs {args.scenario_runs}: {scenario.name} has {known}")
    return [RunConfig(r.name, config_from_args(args, r.config), r.note) for r in runs]


def _with_flags(args, config):
    """Config flags given on the command line, on top of `config` (not --config)."""
    changes = flag_changes(args)
    return config.replace(**changes) if changes else config


def _file_runs(args) -> list[RunConfig]:
    return [RunConfig(Path(f).stem, _with_flags(args, load_config(f)), f)
            for f in args.configs]


def build_sweep(args) -> dict[str, Any]:
    """Everything but the runs: points, load, cost model (None against a live target)."""
    axes = [parse_vary(v) for v in args.vary]
    if args.target:
        check_target_args(args, axes, flag_changes(args))
    base_load: dict[str, Any] = {"num_requests": args.requests}
    if args.seed is not None:
        base_load["seed"] = args.seed
    if args.scenario:
        scenario = get_scenario(args.scenario)
        if args.workload:
            raise ValueError("--scenario and --workload exclude each other")
        if args.target:
            runs, cost, blocks = [], None, None
        else:
            runs = _file_runs(args) if args.configs else _scenario_runs(scenario, args)
            cost, blocks = scenario.cost_model(), scenario.num_gpu_blocks

        def make_workload(load: dict):
            return timed_workload(
                scenario.workload(**{**scenario.defaults, **base_load, **load}),
                args.duration_s, live=bool(args.target))

        name, description = scenario.name, scenario.description
    else:
        if args.scenario_runs is not None:
            raise ValueError("--scenario-runs needs --scenario")
        workload = load_workload(args.workload)
        if args.target:
            runs, cost, blocks = [], None, None
        else:
            config = config_from_args(args)
            runs = _file_runs(args) if args.configs else [
                RunConfig(config.scheduler.batching, config)]
            cost, bpt = _cost_model(args)
            shell = Scenario(workload.name, "", lambda **kw: workload, lambda: cost, (),
                             kv_cache_bytes=getattr(cost, "kv_cache_bytes", lambda: None)(),
                             kv_bytes_per_token=bpt)
            blocks = shell.num_gpu_blocks

        def make_workload(load: dict):
            return timed_workload(override_workload(workload, {**base_load, **load}),
                                  args.duration_s, live=bool(args.target))

        name, description = workload.name, f"workload {args.workload}"
    if args.target:
        description += f", against the live server {args.target}"
        x_axis, points = target_points(args, axes)
    else:
        x_axis, points = build_points(runs, axes)
    return {"name": name, "description": description, "cost": cost, "blocks": blocks,
            "make_workload": make_workload, "axes": axes, "x_axis": x_axis,
            "points": points}


def sweep_result(plan: dict[str, Any], runs: list[dict], args,
                 stopped: str | None = None) -> dict[str, Any]:
    """The result JSON; `stopped` says why it ended early ("interrupted", or the error
    that stopped a live sweep), None when every point ran."""
    slos = [parse_slo(s) for s in args.slo]
    knees = analyze_runs(runs, slos, args.p99_metric, args.min_throughput_gain,
                         args.max_p99_rise, plan["x_axis"])
    return {
        "kind": "sweep", "scenario": plan["name"], "description": plan["description"],
        "cost_model": plan["cost"].describe() if plan["cost"] else None,
        "target": args.target or "sim",
        "requests_per_point": args.requests, "duration_s_per_point": args.duration_s,
        "interrupted": stopped is not None, "stopped": stopped,
        "x_axis": plan["x_axis"],
        "axes": [{"name": a.name, "values": list(a.values), "target": a.target}
                 for a in plan["axes"]],
        "knee_rule": {"min_throughput_gain": args.min_throughput_gain,
                      "max_p99_rise": args.max_p99_rise, "p99_metric": args.p99_metric,
                      "slos": [s.to_dict() for s in slos]},
        "runs": runs, "knees": [k.to_dict() for k in knees], "findings": findings_for(runs),
    }


def check_knee_args(args: argparse.Namespace) -> None:
    """--p99-metric names a latency the summaries have; each --slo limit is a value its
    metric can take (a NaN or negative latency would never be met, silently)."""
    latencies = [f"{name}_{stat}_s" for name in LATENCIES for stat in ("mean", "p50", "p95",
                                                                         "p99")]
    if args.p99_metric not in latencies:
        raise UsageError(f"--p99-metric {args.p99_metric!r}: unknown; allowed: "
                         f"{', '.join(latencies)}")
    for text in args.slo:
        try:
            slo = parse_slo(text)
        except ValueError as e:
            raise UsageError(str(e)) from None
        lo, hi, allowed = metric_range(slo.metric)
        if not lo <= slo.limit <= hi:
            raise UsageError(f"--slo {slo.metric}: limit {slo.limit:g} must be {allowed}")


@reports_usage_errors
def run_sweep_cmd(args: argparse.Namespace) -> int:
    check_flags(args, SWEEP_FLAGS)
    check_knee_args(args)
    check_output_file("--json", args.json)  # before the sweep: its result must not be lost
    check_output_dir("--report", args.report)
    try:
        plan = build_sweep(args)
        [parse_slo(s) for s in args.slo]
        log = None if args.quiet else stderr_log
        if args.target:
            runs, stopped = run_target_points(args, plan["points"], plan["make_workload"],
                                              log)
        else:
            runs, stopped = run_points(plan["points"], plan["make_workload"],
                                       plan["cost"], plan["blocks"], log)
        result = sweep_result(plan, runs, args, stopped)
    except (BenchError, ConfigError, WorkloadError, ValueError, OSError) as e:
        return report_error(e)
    if not runs:
        print("interrupted before the first point ended: nothing to report",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    print(format_knees(result))
    ready = to_json_ready(result)
    if args.json:
        Path(args.json).write_text(json.dumps(ready, indent=1))
        print(f"\nwrote {args.json}")
    if args.report:
        from stepserve.sweep.report import write_report

        page = write_report(ready, args.report)
        print(f"wrote {page}")
    if stopped is not None:
        print(f"{stopped}: {len(runs)} of {len(plan['points'])} points measured; the "
              "result above and any files written are partial", file=sys.stderr)
        return EXIT_INTERRUPTED if stopped == "interrupted" else 2
    return 0


def to_json_ready(result: dict[str, Any]) -> dict[str, Any]:
    return {**result, "runs": [{k: v for k, v in r.items() if k != "_sim"}
                               for r in result["runs"]]}


__all__ = ["KneeResult", "add_sweep_parser", "build_sweep", "run_sweep_cmd"]
