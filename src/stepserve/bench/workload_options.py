"""The bench's request list from its options: a built-in scenario, a workload file, or a
dataset as `vllm bench serve --dataset-name` names it (random lengths, a ShareGPT file,
prefix_repetition, a Mooncake trace), with the arrivals, count and seed overridden."""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

from stepserve.config.limits import MAX_LEN
from stepserve.config.validate import Allowed
from stepserve.workload.arrivals import (
    ArrivalProcess,
    ClosedLoop,
    Constant,
    Gamma,
    Poisson,
    TraceReplay,
)
from stepserve.workload.builtin import get_workload
from stepserve.workload.lengths import fixed, uniform
from stepserve.workload.loader import TraceOptions, load_workload, trace_workload
from stepserve.workload.overrides import WorkloadOverrides, override_workload
from stepserve.workload.shared_prefix import MAX_SHARED_PREFIXES, prefix_name
from stepserve.workload.sharegpt import sharegpt_class
from stepserve.workload.spec import RequestClass, RequestSpec, Workload
from stepserve.workload.trace import MOONCAKE_BLOCK_TOKENS


class BenchError(Exception):
    """Bad input or an unusable target: printed as `error: ...`, exit 2."""


DATASETS = ("random", "sharegpt", "prefix_repetition", "mooncake")  # --dataset-name values
DEFAULT_NUM_PROMPTS = 1000  # vLLM's --num-prompts default
RANDOM_INPUT_LEN, RANDOM_OUTPUT_LEN = 1024, 128  # vLLM's random dataset defaults
# vLLM's prefix_repetition defaults, by the flag's name after --prefix-repetition-
PREFIX_REPETITION_DEFAULTS = {"prefix_len": 256, "suffix_len": 256, "num_prefixes": 10,
                              "output_len": 128}
PREFIX_REPETITION = "prefix_repetition"
MOONCAKE = "mooncake"  # a Mooncake trace (workload/trace.py), on its own times


@dataclass(frozen=True)
class BenchWorkloadOptions:
    """Where the requests come from (at most one source; none is vLLM's default, random
    1024/128) and how they arrive, as `vllm bench serve`'s flags say it: `request_rate`
    (inf: all at once) with `burstiness` (gamma shape; inf: constant rate), and
    `max_concurrency` (with rate inf a closed loop). A dataset without a rate is sent all
    at once, as vLLM does; a scenario or workload file keeps its own arrivals."""

    scenario: str | None = None
    workload: str | None = None
    dataset_name: str | None = None
    random_input_len: int | None = None
    random_output_len: int | None = None
    random_range_ratio: float | None = None
    sharegpt: str | None = None  # the ShareGPT file (--dataset-path, --sharegpt)
    tokenizer: str | None = None  # with sharegpt: count tokens with this model's tokenizer
    sharegpt_output_len: int | None = None
    prefix_repetition_prefix_len: int | None = None
    prefix_repetition_suffix_len: int | None = None
    prefix_repetition_num_prefixes: int | None = None
    prefix_repetition_output_len: int | None = None
    trace_slowdown: float = 1.0  # a Mooncake trace's times multiplied by this
    trace_block_tokens: int = MOONCAKE_BLOCK_TOKENS
    num_prompts: int | None = None
    seed: int | None = None
    request_rate: float | None = None
    burstiness: float | None = None
    max_concurrency: int | None = None
    warmup: int = 0

    def dataset(self) -> str | None:
        """One of DATASETS, or None for a scenario or workload file."""
        if self.scenario or self.workload:
            return None
        if self.dataset_name in (PREFIX_REPETITION, MOONCAKE):
            return self.dataset_name
        return "sharegpt" if self.sharegpt else "random"

    def prefix_repetition(self) -> tuple[int, int, int, int]:
        """(prefix_len, suffix_len, num_prefixes, output_len), vLLM's defaults filled in."""
        prefix, suffix, num, output = (
            default if (v := getattr(self, f"prefix_repetition_{k}")) is None else v
            for k, default in PREFIX_REPETITION_DEFAULTS.items())
        return prefix, suffix, num, output

    def offered_rate(self) -> float | None:
        """The rate the bench offers: a dataset or a cap without a rate is inf (vLLM's
        default); None keeps the workload's own arrivals."""
        if self.request_rate is not None:
            return self.request_rate
        if self.dataset() == MOONCAKE and self.max_concurrency is None:
            return None  # a trace is sent at its own times, as SGLang replays one
        if self.dataset() is not None or self.max_concurrency is not None:
            return math.inf
        return None


def _check_source(o: BenchWorkloadOptions) -> None:
    prefixed = [f"--prefix-repetition-{f.replace('_', '-')}" for f in PREFIX_REPETITION_DEFAULTS
                if getattr(o, f"prefix_repetition_{f}") is not None]
    if prefixed and o.dataset_name != PREFIX_REPETITION:
        raise BenchError(f"{', '.join(prefixed)}: goes with --dataset-name prefix_repetition")
    randoms = (o.random_input_len, o.random_output_len, o.random_range_ratio)
    random_given = o.dataset_name == "random" or any(v is not None for v in randoms)
    given = [n for n, v in (("--scenario", o.scenario), ("--workload", o.workload),
                            ("--random-* / --dataset-name random", random_given),
                            ("--dataset-path / --sharegpt",
                             o.sharegpt and o.dataset_name != MOONCAKE),
                            ("--dataset-name mooncake", o.dataset_name == MOONCAKE),
                            ("--dataset-name prefix_repetition",
                             o.dataset_name == PREFIX_REPETITION))
             if v]
    if o.dataset_name is not None and o.dataset_name not in DATASETS:
        raise BenchError(f"--dataset-name {o.dataset_name!r}: this bench reads "
                         f"{', '.join(DATASETS)} (or --scenario NAME, --workload FILE)")
    if o.dataset_name == "sharegpt" and not o.sharegpt:
        raise BenchError("--dataset-name sharegpt needs --dataset-path FILE (a ShareGPT JSON)")
    if o.dataset_name == MOONCAKE and not o.sharegpt:
        raise BenchError("--dataset-name mooncake needs --dataset-path FILE (a Mooncake "
                         "trace: JSON Lines of timestamp, input_length, output_length, "
                         "hash_ids)")
    if len(given) > 1:
        raise BenchError("give one workload: --scenario NAME, --workload FILE, "
                         "--random-input-len N --random-output-len M (the default), "
                         "--dataset-name sharegpt --dataset-path FILE, or --dataset-name "
                         f"prefix_repetition (got {', '.join(given)})")
    if o.sharegpt_output_len and not o.sharegpt:
        raise BenchError("--sharegpt-output-len goes with --dataset-path / --sharegpt FILE")


def _random_class(o: BenchWorkloadOptions) -> RequestClass:
    """vLLM's random dataset: lengths uniform on [floor(n(1-r)), ceil(n(1+r))]."""
    ratio = o.random_range_ratio or 0.0
    if not 0.0 <= ratio < 1.0:
        raise BenchError(f"--random-range-ratio {ratio:g}: must be in [0, 1)")
    lengths = []
    for flag, n in (("--random-input-len", o.random_input_len or RANDOM_INPUT_LEN),
                    ("--random-output-len", o.random_output_len or RANDOM_OUTPUT_LEN)):
        if n < 1:
            raise BenchError(f"{flag} = {n}: must be >= 1")
        lo, hi = max(1, math.floor(n * (1 - ratio))), max(1, math.ceil(n * (1 + ratio)))
        lengths.append(fixed(n) if lo == hi else uniform(lo, hi))
    return RequestClass("random", 1.0, lengths[0], lengths[1])


def _prefix_repetition_class(o: BenchWorkloadOptions) -> RequestClass:
    """vLLM's prefix_repetition: `num_prefixes` prefixes of `prefix_len` tokens, each
    prompt one of them and then `suffix_len` tokens of its own; `output_len` out."""
    prefix_len, suffix_len, num_prefixes, output_len = o.prefix_repetition()
    for flag, n, lo, hi in (("prefix-len", prefix_len, 1, MAX_LEN - 1),
                            ("suffix-len", suffix_len, 1, MAX_LEN - 1),
                            ("num-prefixes", num_prefixes, 1, MAX_SHARED_PREFIXES),
                            ("output-len", output_len, 1, MAX_LEN)):
        Allowed(lo, hi).check(f"--prefix-repetition-{flag}", n, BenchError)
    if prefix_len + suffix_len > MAX_LEN:
        raise BenchError(f"--prefix-repetition-prefix-len {prefix_len} + --prefix-repetition-"
                         f"suffix-len {suffix_len}: a prompt of at most {MAX_LEN} tokens")
    prompts = o.num_prompts or DEFAULT_NUM_PROMPTS
    if num_prefixes > prompts:
        raise BenchError(f"--prefix-repetition-num-prefixes {num_prefixes}: at most "
                         f"--num-prompts ({prompts}), so every prefix is used")
    return RequestClass(PREFIX_REPETITION, 1.0, fixed(suffix_len), fixed(output_len),
                        shared_prefixes=num_prefixes, prefix_len=prefix_len)


def build_workload(options: BenchWorkloadOptions) -> Workload:
    o = options
    _check_source(o)
    arrival = _arrival(o)  # the load flags, before a file is read
    if o.dataset() == MOONCAKE:
        assert o.sharegpt is not None
        workload = trace_workload(TraceOptions(o.sharegpt, MOONCAKE, o.trace_slowdown,
                                               o.trace_block_tokens))
    elif o.scenario:
        workload = get_workload(o.scenario)
    elif o.workload:
        workload = load_workload(o.workload)
    else:
        cls = _prefix_repetition_class(o) if o.dataset() == PREFIX_REPETITION else \
            sharegpt_class(o.sharegpt, o.tokenizer, o.sharegpt_output_len) if o.sharegpt \
            else _random_class(o)
        workload = Workload(cls.name, (cls,), Poisson(1.0), o.num_prompts or DEFAULT_NUM_PROMPTS)
    if isinstance(workload.arrival, TraceReplay) and arrival is not None:
        arrival = _trace_arrival(o, workload.arrival, arrival)
    return override_workload(workload, WorkloadOverrides(
        num_requests=o.num_prompts, seed=o.seed, arrival=arrival))


def _trace_arrival(o: BenchWorkloadOptions, trace: TraceReplay, arrival: ArrivalProcess
                   ) -> ArrivalProcess:
    """A trace gives every request, so the load flags only change how it is sent: a cap
    replays it closed-loop, rate inf sends it all at once; a finite rate has no place."""
    if isinstance(arrival, ClosedLoop):
        return dataclasses.replace(trace, concurrency=arrival.concurrency)
    if o.request_rate is not None and not math.isinf(o.request_rate):
        raise BenchError(f"--request-rate {o.request_rate:g}: a trace is sent at its own "
                         "times (--trace-slowdown F stretches them; --request-rate inf "
                         "sends it all at once; --max-concurrency N replays it "
                         "closed-loop)")
    return trace  # all at once: make_specs sets every time to 0


def _arrival(o: BenchWorkloadOptions) -> ArrivalProcess | None:
    for flag, v in (("--request-rate", o.request_rate), ("--burstiness", o.burstiness),
                    ("--max-concurrency", o.max_concurrency)):
        if v is not None and not v > 0:
            raise BenchError(f"{flag} {v:g}: must be > 0")
    rate = o.offered_rate()
    if rate is None:
        if o.burstiness is not None:
            raise BenchError("--burstiness needs --request-rate (a scenario or workload "
                             "file keeps its own arrivals without one)")
        return None
    if math.isinf(rate):  # all due at once (burstiness means nothing), times 0.0
        return ClosedLoop(o.max_concurrency) if o.max_concurrency else Poisson(1.0)
    if o.burstiness is not None:
        if math.isinf(o.burstiness):  # the gamma's limit: every gap exactly 1/rate
            return Constant(rate)
        return Gamma(rate, o.burstiness)
    return Poisson(rate)


def make_specs(options: BenchWorkloadOptions, workload: Workload) -> list[RequestSpec]:
    """The requests, due when `vllm bench serve` would send them: all at 0.0 for rate
    inf; for a random (Poisson, gamma) rate the sampled gaps scaled so that their mean
    is exactly 1 / rate, as vLLM scales its delays (throughput then does not wander
    with the random seed)."""
    specs = workload.generate()
    if options.dataset() == PREFIX_REPETITION:
        specs = _balanced_prefixes(specs, options.prefix_repetition()[2], workload.seed)
    rate = options.offered_rate()
    if rate is not None and math.isinf(rate):
        specs = [dataclasses.replace(s, arrival_s=0.0) for s in specs]
    elif rate is not None and isinstance(workload.arrival, (Poisson, Gamma)) and \
            len(specs) > 1 and specs[-1].arrival_s > 0:
        scale = (len(specs) - 1) / rate / specs[-1].arrival_s
        specs = [dataclasses.replace(s, arrival_s=s.arrival_s * scale) for s in specs]
    if options.warmup < 0 or options.warmup >= len(specs):
        raise BenchError(f"--warmup {options.warmup}: must be >= 0 and below the number of "
                         f"requests ({len(specs)})")
    return specs


def _balanced_prefixes(specs: list[RequestSpec], num_prefixes: int, seed: int
                       ) -> list[RequestSpec]:
    """Every prefix on as many prompts as the next (one more for the first few when the
    count does not divide), in a shuffled order, as vLLM's dataset deals them out (it
    drops the remainder; here --num-prompts holds exactly)."""
    names = [prefix_name(PREFIX_REPETITION, i % num_prefixes) for i in range(len(specs))]
    random.Random(seed).shuffle(names)
    return [dataclasses.replace(s, prefix=name) for s, name in zip(specs, names, strict=True)]
