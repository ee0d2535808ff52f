"""`stepserve sweep`: its flags."""

from __future__ import annotations

import argparse

from stepserve.cli.engine_flags import add_config_arguments, config_overrides
from stepserve.cli.simulate import (
    add_cost_model_arguments,
    add_pools_argument,
    cost_model_options,
)
from stepserve.cli_errors import reports_usage_errors
from stepserve.limits import REQUESTS, SECONDS, SEED, STEP_MS, Range, check_flags
from stepserve.sim.scenarios import SCENARIOS
from stepserve.sweep.job import DEFAULT_REQUESTS, SweepOptions, run_sweep
from stepserve.sweep.knee import MAX_P99_RISE, MIN_THROUGHPUT_GAIN, P99_METRIC
from stepserve.sweep.live import LiveOptions

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
    add_pools_argument(p)
    _add_live_flags(p)
    p.add_argument("--json", metavar="OUT", help="write the sweep result as JSON")
    p.add_argument("--report", metavar="DIR", help="write the HTML report and PNGs to DIR")
    p.add_argument("--quiet", action="store_true", help="no per-point progress lines")
    add_config_arguments(p)
    p.set_defaults(func=sweep_command)
    return p


def _add_live_flags(p: argparse.ArgumentParser) -> None:
    live = p.add_argument_group("--target (a live OpenAI-compatible server)")
    live.add_argument("--target", metavar="URL",
                      help="sweep the load (--vary rate=... or concurrency=...) against this "
                           "server instead of the simulator; the workload comes from "
                           "--scenario or --workload")
    live.add_argument("--predict", metavar="COST_FILE",
                      help="also run the same points in the simulator with this cost file "
                           "(`stepserve profile`), as a second series: both knees, both "
                           "curves on one plot; engine flags then describe the server")
    live.add_argument("--model", help="model name sent (default: the first of /v1/models)")
    live.add_argument("--warmup", type=int, default=0, metavar="N",
                      help="per point, the first N requests are excluded from the metrics")
    live.add_argument("--timeout-s", type=float, default=600.0, help="per-request timeout")
    live.add_argument("--metrics-interval-s", type=float, default=0.25,
                      help="how often to scrape the target's /metrics (0: never)")


def sweep_options(args: argparse.Namespace) -> SweepOptions:
    live = LiveOptions(args.target, args.model, args.warmup, args.timeout_s,
                       args.metrics_interval_s) if args.target else None
    return SweepOptions(
        scenario=args.scenario, workload=args.workload,
        configs=tuple(args.configs) if args.configs else None,
        scenario_runs=args.scenario_runs, vary=tuple(args.vary), requests=args.requests,
        duration_s=args.duration_s, seed=args.seed, config=config_overrides(args),
        slo=tuple(args.slo), min_throughput_gain=args.min_throughput_gain,
        max_p99_rise=args.max_p99_rise, p99_metric=args.p99_metric,
        cost=cost_model_options(args), live=live, json_out=args.json, report=args.report,
        quiet=args.quiet, pools=args.pools, predict=args.predict)


@reports_usage_errors
def sweep_command(args: argparse.Namespace) -> int:
    check_flags(args, SWEEP_FLAGS)
    return run_sweep(sweep_options(args))
