"""The bench's request list from its options: a built-in scenario, a workload file, fixed
random lengths or a ShareGPT-style JSON file (workload/sharegpt.py), with the arrival
process, count and seed overridden (workload/overrides.py)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from stepserve.workload.arrivals import ArrivalProcess, ClosedLoop, Constant, Gamma, Poisson
from stepserve.workload.lengths import fixed
from stepserve.workload.loader import load_workload
from stepserve.workload.overrides import WorkloadOverrides, override_workload
from stepserve.workload.scenarios import get_workload
from stepserve.workload.sharegpt import sharegpt_class
from stepserve.workload.spec import RequestClass, RequestSpec, Workload


class BenchError(Exception):
    """Bad input or an unusable target: printed as `error: ...`, exit 2."""


@dataclass(frozen=True)
class BenchWorkloadOptions:
    """Where the requests come from (exactly one of scenario, workload, the two random
    lengths, sharegpt) and how they arrive, as `vllm bench serve`'s flags say it:
    `request_rate` (inf: all at once) with `burstiness` (gamma shape; inf: constant
    rate), or `max_concurrency` (closed loop); neither keeps the workload's own."""

    scenario: str | None = None
    workload: str | None = None
    random_input_len: int | None = None
    random_output_len: int | None = None
    sharegpt: str | None = None
    tokenizer: str | None = None  # with sharegpt: count tokens with this model's tokenizer
    sharegpt_output_len: int | None = None
    num_prompts: int | None = None
    seed: int | None = None
    request_rate: float | None = None
    burstiness: float | None = None
    max_concurrency: int | None = None
    warmup: int = 0


def build_workload(options: BenchWorkloadOptions) -> Workload:
    o = options
    randoms = (o.random_input_len, o.random_output_len)
    given = [n for n, v in (("--scenario", o.scenario), ("--workload", o.workload),
                            ("--random-*-len", any(v is not None for v in randoms)),
                            ("--sharegpt", o.sharegpt))
             if v]
    if len(given) != 1:
        raise BenchError("give exactly one workload: --scenario NAME, --workload FILE, "
                         "--random-input-len N --random-output-len M, or --sharegpt FILE"
                         + (f" (got {', '.join(given)})" if given else ""))
    if (o.tokenizer or o.sharegpt_output_len) and not o.sharegpt:
        raise BenchError("--tokenizer and --sharegpt-output-len go with --sharegpt FILE")
    if o.scenario:
        workload = get_workload(o.scenario)
    elif o.workload:
        workload = load_workload(o.workload)
    elif o.sharegpt:
        cls = sharegpt_class(o.sharegpt, o.tokenizer, o.sharegpt_output_len)
        workload = Workload("sharegpt", (cls,), Poisson(1.0), o.num_prompts or 100)
    else:
        if o.random_input_len is None or o.random_output_len is None:
            raise BenchError("--random-input-len and --random-output-len go together")
        for flag, v in (("--random-input-len", o.random_input_len),
                        ("--random-output-len", o.random_output_len)):
            if v < 1:
                raise BenchError(f"{flag} = {v}: must be >= 1")
        cls = RequestClass("random", 1.0, fixed(o.random_input_len),
                           fixed(o.random_output_len))
        workload = Workload("random", (cls,), Poisson(1.0), o.num_prompts or 100)
    return override_workload(workload, WorkloadOverrides(
        num_requests=o.num_prompts, seed=o.seed, arrival=_arrival(o)))


def _arrival(o: BenchWorkloadOptions) -> ArrivalProcess | None:
    for flag, v in (("--request-rate", o.request_rate), ("--burstiness", o.burstiness),
                    ("--max-concurrency", o.max_concurrency)):
        if v is not None and not v > 0:
            raise BenchError(f"{flag} {v:g}: must be > 0")
    if o.max_concurrency is not None:
        if o.request_rate is not None or o.burstiness is not None:
            raise BenchError("--max-concurrency (closed loop) excludes --request-rate and "
                             "--burstiness (open loop)")
        return ClosedLoop(o.max_concurrency)
    if o.request_rate is None:
        if o.burstiness is not None:
            raise BenchError("--burstiness needs --request-rate")
        return None
    if math.isinf(o.request_rate):
        return Poisson(1.0)  # times replaced by 0.0 in make_specs
    if o.burstiness is not None:
        if math.isinf(o.burstiness):  # the gamma's limit: every gap exactly 1/rate
            return Constant(o.request_rate)
        return Gamma(o.request_rate, o.burstiness)
    return Poisson(o.request_rate)


def make_specs(options: BenchWorkloadOptions, workload: Workload) -> list[RequestSpec]:
    specs = workload.generate()
    if options.request_rate is not None and math.isinf(options.request_rate):
        specs = [dataclasses.replace(s, arrival_s=0.0) for s in specs]
    if options.warmup < 0 or options.warmup >= len(specs):
        raise BenchError(f"--warmup {options.warmup}: must be >= 0 and below the number of "
                         f"requests ({len(specs)})")
    return specs
