"""`stepserve simulate`: its flags, and the cost-model flags simulate, sweep and bench share."""

from __future__ import annotations

import argparse

from stepserve.cli.engine_flags import add_config_arguments, config_overrides
from stepserve.cli.parser import add_command, options_from
from stepserve.config.limits import RATE, REQUESTS, SEED, STEP_MS
from stepserve.sim.cost_options import CostModelOptions
from stepserve.sim.engine_kinds import ENGINE_KINDS
from stepserve.sim.job import SimulateOptions, run_simulate
from stepserve.sim.scenarios import SCENARIOS
from stepserve.workload.loader import TraceOptions
from stepserve.workload.overrides import WorkloadOverrides
from stepserve.workload.trace import MOONCAKE_BLOCK_TOKENS, TRACE_FORMATS

SIMULATE_FLAGS = {"requests": REQUESTS, "rate": RATE, "seed": SEED, "step_ms": STEP_MS,
                  "spread_seed": SEED}


def add_simulate_parser(subparsers) -> None:
    p = add_command(
        subparsers, "simulate", lambda args: run_simulate(simulate_options(args)),
        SIMULATE_FLAGS, help="run the real scheduler on a virtual clock with a cost model",
        description="Simulate a built-in scenario (--scenario), your own workload "
                    "(--workload FILE) or a trace (--trace FILE), with --config FILE "
                    "and/or vLLM-style flags.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--scenario", choices=sorted(SCENARIOS), help="a built-in scenario")
    src.add_argument("--workload", help="a workload YAML file (see docs/guide.md)")
    src.add_argument("--trace", metavar="FILE",
                     help="a JSON Lines trace to replay on its own times: ours (prompt_len, "
                          "...) or Mooncake's (timestamp, input_length, output_length, "
                          "hash_ids)")
    add_trace_arguments(p)
    p.add_argument("--config",
                   help="engine config YAML (the incidents' shape: scheduler:, queue:, ...)")
    p.add_argument("--runs", help="scenario runs to do, comma-separated (default: all)")
    p.add_argument("--requests", type=int, help="override the number of requests "
                   "(default: the scenario's or workload's own)")
    p.add_argument("--rate", type=float, help="override the arrival rate (req/s) "
                   "(default: the scenario's or workload's own)")
    p.add_argument("--seed", type=int, help="override the workload seed "
                   "(default: the scenario's or workload's own)")
    add_cost_model_arguments(p, default=None)
    add_pools_argument(p)
    p.add_argument("--json", dest="json_out", metavar="OUT",
                   help="also write the result as JSON to OUT")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_config_arguments(p)


def add_trace_arguments(p, with_format: bool = True) -> None:
    """How a trace is read: shared by simulate and bench (whose --dataset-name names the
    format)."""
    if with_format:
        p.add_argument("--trace-format", choices=TRACE_FORMATS, default="auto",
                       help="auto (default): Mooncake's if the first line has "
                            "input_length")
    p.add_argument("--trace-slowdown", "--mooncake-slowdown-factor", type=float,
                   default=1.0, metavar="F",
                   help="a trace's arrival times multiplied by F (2: half the rate)")
    p.add_argument("--trace-block-tokens", type=int, default=MOONCAKE_BLOCK_TOKENS,
                   metavar="N", help="prompt tokens per Mooncake hash id (default "
                                     f"{MOONCAKE_BLOCK_TOKENS}, Mooncake's)")


def add_cost_model_arguments(p, default: str | None = "roofline") -> None:
    """--cost, --step-ms, --hardware, --model-spec: shared by simulate, sweep and bench."""
    own = "default: the scenario's own, else roofline" if default is None \
        else f"default: {default}; a scenario brings its own unless this is given"
    p.add_argument("--cost", default=default, metavar="constant|roofline|FILE",
                   help="cost model: constant, roofline, or a cost file written by "
                        f"`stepserve profile` ({own})")
    p.add_argument("--step-ms", type=float, default=25.0, help="constant cost: ms per step")
    p.add_argument("--hardware", default="h100", help="roofline: hardware preset")
    p.add_argument("--model-spec", default="llama-3-8b", help="roofline: model preset")
    p.add_argument("--engine-kind", choices=ENGINE_KINDS, default=None,
                   help="the engine whose scheduling rules the runs follow, as our "
                        "scheduler's settings (docs/guide.md, engine kinds) (default: a "
                        "target profile's engine, else stepserve)")
    p.add_argument("--spread-seed", type=int, default=0, metavar="N",
                   help="a target profile's spread: the seed of each step's drawn time")
    p.add_argument("--no-spread", action="store_true",
                   help="a target profile's spread unused: the cost model's times as they are")


def add_pools_argument(p) -> None:
    """--pools FILE: shared by simulate and sweep."""
    p.add_argument("--pools", metavar="FILE",
                   help="a pools file (replicas, router, pools, routing rules; see "
                        "docs/guide.md): each run becomes that deployment")


def cost_model_options(args: argparse.Namespace) -> CostModelOptions:
    return options_from(CostModelOptions, args)


def simulate_options(args: argparse.Namespace) -> SimulateOptions:
    trace = TraceOptions(args.trace, args.trace_format, args.trace_slowdown,
                         args.trace_block_tokens) if args.trace else None
    return options_from(
        SimulateOptions, args, trace=trace,
        config=config_overrides(args), runs=tuple(args.runs.split(",")) if args.runs else None,
        overrides=options_from(WorkloadOverrides, args, num_requests=args.requests),
        cost=cost_model_options(args), progress=not args.no_progress)
