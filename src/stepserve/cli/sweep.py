"""`stepserve sweep`: its flags."""

from __future__ import annotations

import argparse

from stepserve.cli.engine_flags import add_config_arguments, config_overrides
from stepserve.cli.parser import add_command, options_from
from stepserve.cli.simulate import (
    add_cost_model_arguments,
    add_pools_argument,
    cost_model_options,
)
from stepserve.config.limits import RATE, REQUESTS, SECONDS, SEED, STEP_MS, Range
from stepserve.sim.scenarios import SCENARIOS
from stepserve.sweep.job import DEFAULT_REQUESTS, SweepOptions, run_sweep
from stepserve.sweep.knee import MAX_P99_RISE, MIN_THROUGHPUT_GAIN, NOISE_MARGIN, P99_METRIC
from stepserve.sweep.points import MIN_SPAN_S, LiveOptions
from stepserve.sweep.window import WARMUP_SHARE, WINDOWS, WindowRule

# The knee's fractions: a gain of 10x or a rise of 1000x is no threshold at all.
SWEEP_FLAGS = {
    "requests": REQUESTS, "duration_s": SECONDS, "seed": SEED,
    "min_throughput_gain": Range(0.0, 10.0, float), "max_p99_rise": Range(0.0, 1000.0, float),
    "noise_margin": Range(0.0, 1.0, float), "warmup_share": Range(0.0, 0.9, float),
    "rate": RATE,
    "warmup": Range(0, REQUESTS.hi), "timeout_s": SECONDS,
    "metrics_interval_s": Range(0.0, 3600.0, float), "step_ms": STEP_MS, "spread_seed": SEED,
}


def add_sweep_parser(subparsers) -> None:
    p = add_command(
        subparsers, "sweep", lambda args: run_sweep(sweep_options(args)), SWEEP_FLAGS,
        help="sweep configs or load (simulator or live server) and find the knee",
        description="Run one fixed request count per point on the simulator (or, with "
                    "--target, against a running server), each measured over its steady "
                    "window (--window), find where throughput stops rising while P99 "
                    "climbs, mark the knee (the last point before the P99 cliff), and "
                    "recommend the last point at or before it that meets the SLO.")
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
                        "(rate, seed, concurrency); repeat for a grid; the last is the x "
                        "axis (default: none: the runs themselves are the x axis)")
    p.add_argument("--rate", type=float, metavar="R",
                   help="a fixed offered rate (req/s) for every point, e.g. while --vary "
                        "changes a setting (default: the scenario's or workload's own)")
    p.add_argument("--requests", type=int,
                   help=f"requests per point (default: {DEFAULT_REQUESTS}, or on the "
                        f"simulator {MIN_SPAN_S:g} s of arrivals where the rate brings "
                        "more, so that each point has a steady window)")
    p.add_argument("--duration-s", type=float, metavar="S",
                   help="run each point for S seconds of arrivals instead of a request "
                        "count (the domain document's figure: 5 minutes per config); open "
                        "loop sends what the rate brings in S; closed loop (--target only) "
                        "stops issuing at S, after at most --requests (default: none: "
                        "--requests per point)")
    p.add_argument("--seed", type=int,
                   help="workload seed (default: the scenario's or workload's own)")
    p.add_argument("--config", help="base engine config YAML for --workload")
    p.add_argument("--window", choices=WINDOWS, default="steady",
                   help="what each point's numbers measure: steady = tokens produced from "
                        "its first arrival + --warmup-share of the arrival span to its "
                        "last arrival, and the latencies of the requests that arrived in "
                        "it (warm-up and drain left out, as GuideLLM and vllm bench serve "
                        "measure); whole = the whole run, drain included")
    p.add_argument("--warmup-share", type=float, default=WARMUP_SHARE, metavar="F",
                   help="steady window: the share of each point's arrival span left out "
                        "as warm-up")
    p.add_argument("--slo", action="append", default=[], metavar="METRIC=LIMIT",
                   help="e.g. ttft_p99_s=2 (at most) or throughput_tokens_per_s>=1000")
    p.add_argument("--min-throughput-gain", type=float, default=MIN_THROUGHPUT_GAIN,
                   help="knee: throughput gains less than this vs the previous point")
    p.add_argument("--max-p99-rise", type=float, default=MAX_P99_RISE,
                   help="knee: while P99 rises more than this")
    p.add_argument("--noise-margin", type=float, default=NOISE_MARGIN, metavar="F",
                   help="flat throughput: a later point must beat an earlier one by more "
                        "than this share (in throughput, or a lower P99) to count as a "
                        "gain; smaller differences are measurement noise")
    p.add_argument("--p99-metric", default=P99_METRIC,
                   help="the tail metric for the knee")
    add_cost_model_arguments(p, default=None)
    add_pools_argument(p)
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
                      help="per point, the first N requests are excluded from the metrics "
                           "(a live point is measured whole after them)")
    live.add_argument("--timeout-s", type=float, default=600.0, help="per-request timeout")
    live.add_argument("--metrics-interval-s", type=float, default=0.25,
                      help="how often to scrape the target's /metrics (0: never)")
    p.add_argument("--json", dest="json_out", metavar="OUT", help="write the sweep result as JSON")
    p.add_argument("--report", metavar="DIR", help="write the HTML report and PNGs to DIR")
    p.add_argument("--quiet", action="store_true", help="no per-point progress lines")
    add_config_arguments(p)


def sweep_options(args: argparse.Namespace) -> SweepOptions:
    live = options_from(LiveOptions, args) if args.target else None
    return options_from(
        SweepOptions, args, configs=tuple(args.configs) if args.configs else None,
        vary=tuple(args.vary), config=config_overrides(args), slo=tuple(args.slo),
        cost=cost_model_options(args), live=live, window=WindowRule(args.window, args.warmup_share))
