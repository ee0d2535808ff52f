"""`stepserve plan speedup | capacity | models`: their flags."""

from __future__ import annotations

import argparse
from typing import Any

from stepserve.cli.parser import add_command
from stepserve.config import limits
from stepserve.config.limits import Range
from stepserve.plan.job import run_capacity, run_model_specs, run_speedup
from stepserve.plan.speedup import ORDERS

# Bounds of the numeric flags: --concurrency is a static batch's slots (max_num_seqs).
PLAN_FLAGS = {"concurrency": Range(1, limits.MAX_NUM_SEQS), "max_len": limits.LENGTH,
              "peak_concurrency": Range(1, limits.MAX_NUM_REQUESTS)}


def add_plan_parser(subparsers: Any) -> None:
    plan = subparsers.add_parser(
        "plan", help="capacity and speedup arithmetic (no model, no simulation)",
        description="Back-of-the-envelope planning: the incidents' worked arithmetic, exact.")
    sub = plan.add_subparsers(dest="plan_command", metavar="{speedup,capacity,models}")
    sub.required = True
    p = add_command(
        sub, "speedup", lambda args: run_speedup(tuple(args.group), args.concurrency,
                                                 args.order, args.json),
        PLAN_FLAGS, help="slot utilisation of static batching and the continuous-batching cap",
        description="Static batching runs each batch until its longest request ends; "
                    "requests fill batches of --concurrency in arrival order: the groups "
                    "in the order given (or longest first, --order longest-first). Where "
                    "the requests need more than one batch, the order changes static steps "
                    "and the cap: the output also gives their range over every order "
                    "(JSON: static_steps_min/max, speedup_cap_min/max).")
    p.add_argument("--group", action="append", required=True, metavar="COUNTxLENGTH",
                   help="COUNT requests of LENGTH output tokens, e.g. 10x2000; repeatable, "
                        "in arrival order")
    p.add_argument("--concurrency", type=int, required=True, metavar="N",
                   help="slots per static batch (max_num_seqs)")
    p.add_argument("--order", choices=ORDERS, default="given",
                   help="how requests fill the static batches: given = the --group order "
                        "(arrival order), longest-first = sorted, the fewest static steps")
    c = add_command(
        sub, "capacity", capacity_command, PLAN_FLAGS,
        help="sequences per replica from KV memory, max_num_seqs, replicas",
        description="Sizes concurrency by the worst case: every sequence may reach --max-len.")
    c.add_argument("--kv-memory", required=True, metavar="SIZE",
                   help="KV cache memory per replica, e.g. 38GB or 35GiB")
    per_token = c.add_mutually_exclusive_group(required=True)
    per_token.add_argument("--kv-bytes-per-token", metavar="SIZE",
                           help="KV bytes per token over all layers, e.g. 192KiB")
    per_token.add_argument("--model-spec", metavar="NAME",
                           help="derive KV bytes per token from a preset (see `plan models`)")
    c.add_argument("--max-len", type=int, required=True, metavar="N",
                   help="longest sequence (prompt + output) in tokens, i.e. max_model_len")
    c.add_argument("--headroom", type=float, default=0.15, metavar="F",
                   help="share of KV memory kept free when setting max_num_seqs")
    c.add_argument("--peak-concurrency", type=int, required=True, metavar="N",
                   help="concurrent requests at peak")
    m = add_command(sub, "models", lambda args: run_model_specs(args.json),
                    help="list the model spec presets")
    for parser, what in ((p, "result"), (c, "result"), (m, "presets")):
        parser.add_argument("--json", action="store_true", help=f"print the {what} as JSON")


def capacity_command(args: argparse.Namespace) -> int:
    return run_capacity(args.kv_memory, args.max_len, args.peak_concurrency,
                        kv_bytes_per_token=args.kv_bytes_per_token, model_spec=args.model_spec,
                        headroom=args.headroom, as_json=args.json)
