"""The bench's request list from its flags: a built-in scenario, a workload file, fixed
random lengths or a ShareGPT-style JSON file (workload/sharegpt.py), with the arrival
process, count and seed overridden by flags."""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any

from stepserve.workload.arrivals import ClosedLoop, Constant, Gamma, Poisson
from stepserve.workload.lengths import fixed
from stepserve.workload.loader import load_workload
from stepserve.workload.scenarios import get_workload
from stepserve.workload.sharegpt import sharegpt_class
from stepserve.workload.spec import RequestClass, RequestSpec, Workload


class BenchError(Exception):
    """Bad input or an unusable target: printed as `error: ...`, exit 2."""


def build_workload(args: argparse.Namespace) -> Workload:
    randoms = (args.random_input_len, args.random_output_len)
    given = [n for n, v in (("--scenario", args.scenario), ("--workload", args.workload),
                            ("--random-*-len", any(v is not None for v in randoms)),
                            ("--sharegpt", args.sharegpt))
             if v]
    if len(given) != 1:
        raise BenchError("give exactly one workload: --scenario NAME, --workload FILE, "
                         "--random-input-len N --random-output-len M, or --sharegpt FILE"
                         + (f" (got {', '.join(given)})" if given else ""))
    if (args.tokenizer or args.sharegpt_output_len) and not args.sharegpt:
        raise BenchError("--tokenizer and --sharegpt-output-len go with --sharegpt FILE")
    if args.scenario:
        kw: dict[str, Any] = {}
        if args.num_prompts is not None:
            kw["num_requests"] = args.num_prompts
        if args.seed is not None:
            kw["seed"] = args.seed
        workload = get_workload(args.scenario, **kw)
    elif args.workload:
        workload = load_workload(args.workload)
    elif args.sharegpt:
        cls = sharegpt_class(args.sharegpt, args.tokenizer, args.sharegpt_output_len)
        workload = Workload("sharegpt", (cls,), Poisson(1.0), args.num_prompts or 100)
    else:
        if None in randoms:
            raise BenchError("--random-input-len and --random-output-len go together")
        for flag, v in (("--random-input-len", args.random_input_len),
                        ("--random-output-len", args.random_output_len)):
            if v < 1:
                raise BenchError(f"{flag} = {v}: must be >= 1")
        cls = RequestClass("random", 1.0, fixed(args.random_input_len),
                           fixed(args.random_output_len))
        workload = Workload("random", (cls,), Poisson(1.0), args.num_prompts or 100)
    changes: dict[str, Any] = {}
    if args.num_prompts is not None:
        changes["num_requests"] = args.num_prompts
    if args.seed is not None:
        changes["seed"] = args.seed
    arrival = _arrival(args)
    if arrival is not None:
        changes["arrival"] = arrival
    return dataclasses.replace(workload, **changes) if changes else workload


def _arrival(args: argparse.Namespace):
    for flag, v in (("--request-rate", args.request_rate), ("--burstiness", args.burstiness),
                    ("--max-concurrency", args.max_concurrency)):
        if v is not None and not v > 0:
            raise BenchError(f"{flag} {v:g}: must be > 0")
    if args.max_concurrency is not None:
        if args.request_rate is not None or args.burstiness is not None:
            raise BenchError("--max-concurrency (closed loop) excludes --request-rate and "
                             "--burstiness (open loop)")
        return ClosedLoop(args.max_concurrency)
    if args.request_rate is None:
        if args.burstiness is not None:
            raise BenchError("--burstiness needs --request-rate")
        return None
    if math.isinf(args.request_rate):
        return Poisson(1.0)  # times replaced by 0.0 in make_specs
    if args.burstiness is not None:
        if math.isinf(args.burstiness):  # the gamma's limit: every gap exactly 1/rate
            return Constant(args.request_rate)
        return Gamma(args.request_rate, args.burstiness)
    return Poisson(args.request_rate)


def make_specs(args: argparse.Namespace, workload: Workload) -> list[RequestSpec]:
    specs = workload.generate()
    if args.request_rate is not None and math.isinf(args.request_rate):
        specs = [dataclasses.replace(s, arrival_s=0.0) for s in specs]
    if args.warmup < 0 or args.warmup >= len(specs):
        raise BenchError(f"--warmup {args.warmup}: must be >= 0 and below the number of "
                         f"requests ({len(specs)})")
    return specs
