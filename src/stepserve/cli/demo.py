"""`stepserve demo`: the night-report incident's job on a real model and in the simulator."""

from __future__ import annotations

from stepserve.cli.parser import add_command, options_from
from stepserve.config.limits import REQUESTS, Range
from stepserve.demo.job import DemoOptions, run_demo

# Bounds of the flags: the real engine runs with max_model_len 2048 and ~20-token prompts
# on a CPU, so outputs stay under 1,024 tokens and requests in the thousands.
DEMO_FLAGS = {"requests": Range(1, 10_000), "short": Range(1, 1024), "long": Range(1, 1024),
              "sim_requests": REQUESTS}


def add_demo_parser(subparsers) -> None:
    p = add_command(
        subparsers, "demo",
        lambda args: run_demo(options_from(DemoOptions, args)), DEMO_FLAGS,
        help="the night-report incident's job on a real model and in the simulator")
    p.add_argument("--model", default="default", help="model preset or HF directory")
    d = DemoOptions()
    p.add_argument("--requests", type=int, default=d.requests, help="real-engine requests")
    p.add_argument("--short", type=int, default=d.short, help="short output length (tokens)")
    p.add_argument("--long", type=int, default=d.long, help="long output length (tokens)")
    p.add_argument("--sim-requests", type=int, default=d.sim_requests, help="simulated requests")
    p.add_argument("--json", dest="json_out", metavar="OUT", help="also write the table as JSON")
    p.add_argument("--cost", metavar="constant|roofline|FILE",
                   help="the simulator's cost model: a `stepserve profile` file predicts "
                        "this machine (default: SmolLM2 on an H100's roofline)")
