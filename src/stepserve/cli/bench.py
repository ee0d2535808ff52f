"""`stepserve bench`: its flags (vLLM's `bench serve` names where it has them).

    stepserve bench --target http://127.0.0.1:8000 --random-input-len 64 \\
        --random-output-len 32 --num-prompts 50 --request-rate 4 --goodput ttft:500
    stepserve bench --sim --scenario mixed-pool --num-prompts 200 --json out.json
"""

from __future__ import annotations

import argparse

from stepserve.bench.job import BenchOptions, run_bench
from stepserve.bench.plan import BenchWorkloadOptions
from stepserve.cli.engine_flags import add_config_arguments, config_overrides
from stepserve.cli.simulate import add_cost_model_arguments, cost_model_options
from stepserve.cli_errors import reports_usage_errors
from stepserve.limits import (
    CONCURRENCY,
    LENGTH,
    MAX_BURSTINESS,
    MAX_NUM_REQUESTS,
    MAX_RATE,
    MIN_BURSTINESS,
    MIN_RATE,
    REQUESTS,
    SECONDS,
    SEED,
    STEP_MS,
    Range,
    check_flags,
)
from stepserve.workload.scenarios import list_workloads

# Bounds of the numeric flags (limits.py); engine settings are bounded by config.py.
BENCH_FLAGS = {
    "random_input_len": LENGTH, "random_output_len": LENGTH, "sharegpt_output_len": LENGTH,
    "num_prompts": REQUESTS, "seed": SEED, "max_concurrency": CONCURRENCY,
    "request_rate": Range(MIN_RATE, MAX_RATE, float, inf_ok=True),
    "burstiness": Range(MIN_BURSTINESS, MAX_BURSTINESS, float, inf_ok=True),
    "duration_s": SECONDS, "warmup": Range(0, MAX_NUM_REQUESTS), "timeout_s": SECONDS,
    "metrics_interval_s": Range(0.0, 3600.0, float),  # 0: never scrape
    "step_ms": STEP_MS,
}


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="load an OpenAI-compatible server (or the engine, or the simulator)",
        description="Send a workload to --target URL (streaming /v1/completions), to the "
                    "in-process engine (--engine) or to the simulator (--sim), and report "
                    "TTFT, TPOT, ITL, E2EL, throughput and goodput with vLLM's definitions.")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--target", metavar="URL", help="base URL, e.g. http://127.0.0.1:8000")
    where.add_argument("--engine", action="store_true", help="the real engine, in process")
    where.add_argument("--sim", action="store_true", help="the simulator (virtual clock)")
    p.add_argument("--model", help="model name sent to the target (default: the first of "
                   "/v1/models); with --engine the model to load (default: tiny)")
    w = p.add_argument_group("workload")
    w.add_argument("--scenario", choices=list_workloads(), help="a built-in workload")
    w.add_argument("--workload", metavar="FILE", help="a workload YAML file")
    w.add_argument("--random-input-len", type=int, metavar="N", help="fixed prompt length")
    w.add_argument("--random-output-len", type=int, metavar="M", help="fixed output length")
    w.add_argument("--sharegpt", metavar="FILE",
                   help="(prompt, output) lengths from a ShareGPT-style JSON file")
    w.add_argument("--tokenizer", metavar="MODEL",
                   help="with --sharegpt: count tokens with this model's tokenizer (a "
                        "stepserve model name or a local HF directory; default: estimate "
                        "4 characters per token)")
    w.add_argument("--sharegpt-output-len", type=int, metavar="M",
                   help="with --sharegpt: every output this long instead of the answer's")
    w.add_argument("--num-prompts", type=int, metavar="K",
                   help="requests to send (warm-up included)")
    w.add_argument("--seed", type=int, help="workload seed")
    w.add_argument("--request-rate", type=float, metavar="R",
                   help="open loop, req/s (Poisson; inf: all at once)")
    w.add_argument("--burstiness", type=float, metavar="B",
                   help="gamma arrivals with this shape (1 = Poisson, below 1 burstier, "
                        "inf = constant rate)")
    w.add_argument("--max-concurrency", type=int, metavar="N",
                   help="closed loop: N requests in flight")
    w.add_argument("--duration-s", type=float, help="stop sending after this many seconds")
    w.add_argument("--warmup", type=int, default=0, metavar="N",
                   help="the first N requests are sent but excluded from the metrics")
    w.add_argument("--text-prompts", action="store_true",
                   help="send text prompts instead of token-id lists")
    w.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let the model stop at EOS (default: ignore_eos, lengths honoured)")
    o = p.add_argument_group("output")
    o.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="SLOs in ms, e.g. ttft:500 tpot:50 e2el:3000")
    o.add_argument("--metrics-interval-s", type=float, default=0.5,
                   help="how often to scrape the target's /metrics (0: never)")
    o.add_argument("--timeout-s", type=float, default=600.0, help="per-request timeout")
    o.add_argument("--json", metavar="OUT", help="write the result as JSON")
    o.add_argument("--csv", metavar="OUT", help="write one row per request")
    o.add_argument("--markdown", metavar="OUT", help="write the summary table as Markdown")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    s = p.add_argument_group("--engine / --sim")
    s.add_argument("--config", help="engine config YAML")
    add_cost_model_arguments(s)
    add_config_arguments(p)
    p.set_defaults(func=bench_command)
    return p


def bench_options(args: argparse.Namespace) -> BenchOptions:
    workload = BenchWorkloadOptions(
        scenario=args.scenario, workload=args.workload,
        random_input_len=args.random_input_len, random_output_len=args.random_output_len,
        sharegpt=args.sharegpt, tokenizer=args.tokenizer,
        sharegpt_output_len=args.sharegpt_output_len, num_prompts=args.num_prompts,
        seed=args.seed, request_rate=args.request_rate, burstiness=args.burstiness,
        max_concurrency=args.max_concurrency, warmup=args.warmup)
    return BenchOptions(
        target=args.target, engine=args.engine, sim=args.sim, model=args.model,
        workload=workload, duration_s=args.duration_s, text_prompts=args.text_prompts,
        ignore_eos=args.ignore_eos,
        goodput=tuple(args.goodput) if args.goodput is not None else None,
        metrics_interval_s=args.metrics_interval_s, timeout_s=args.timeout_s,
        json_out=args.json, csv_out=args.csv, markdown_out=args.markdown,
        progress=not args.no_progress, config=config_overrides(args),
        cost=cost_model_options(args))


@reports_usage_errors
def bench_command(args: argparse.Namespace) -> int:
    check_flags(args, BENCH_FLAGS)
    return run_bench(bench_options(args))
