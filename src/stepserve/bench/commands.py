"""`stepserve bench`: load a target with a workload and report TTFT, TPOT, ITL, E2EL,
throughput and goodput (vLLM's definitions), plus the target's own /metrics.

    stepserve bench --target http://127.0.0.1:8000 --random-input-len 64 \\
        --random-output-len 32 --num-prompts 50 --request-rate 4 --goodput ttft:500
    stepserve bench --sim --scenario mixed-pool --num-prompts 200 --json out.json

Exit status: 0 done (server errors are counted, not fatal); 2 bad input or an
unreachable target; 130 interrupted (the partial result is still written).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from typing import Any

from stepserve.bench.client import RequestRecord
from stepserve.bench.http_run import HttpRun, bench_http, check_url
from stepserve.bench.loadgen import LoadPlan, make_records
from stepserve.bench.plan import BenchError, build_workload, make_specs
from stepserve.bench.results import (
    format_table,
    summarize_records,
    write_csv,
    write_json,
    write_markdown,
)
from stepserve.bench.run_data import http_extras, latency_samples
from stepserve.bench.slo import SLO, SLOError, parse_slo
from stepserve.cli_errors import UsageError, report_error, reports_usage_errors
from stepserve.config import ConfigError
from stepserve.config_load import to_dict as config_to_dict
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
from stepserve.metrics.alerts import findings_for
from stepserve.user_files import check_output_file
from stepserve.workload.errors import WorkloadError
from stepserve.workload.scenarios import list_workloads
from stepserve.workload.spec import Workload

EXIT_INTERRUPTED = 130
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
OUTPUT_FLAGS = ("json", "csv", "markdown")


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
    from stepserve.sim.commands import add_cost_model_arguments

    add_cost_model_arguments(s)
    from stepserve.config_load import add_config_arguments

    add_config_arguments(p)
    p.set_defaults(func=run_bench)
    return p


# ---- targets ----

def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="bench", unit="req", file=sys.stderr, mininterval=0.5,
                disable=not enabled, leave=False)


def _engine_config(args):
    from stepserve.config_load import config_from_args

    return config_from_args(args)


def _sim_cost(args, config):
    from stepserve.sim.commands import _cost_model
    from stepserve.sim.scenarios import RunSpec, Scenario

    cost, bpt = _cost_model(args)
    scenario = Scenario("bench", "bench", lambda **kw: None, lambda: cost,
                        (RunSpec(config.scheduler.batching, config),),
                        kv_cache_bytes=getattr(cost, "kv_cache_bytes", lambda: None)(),
                        kv_bytes_per_token=bpt)
    return cost, scenario.num_gpu_blocks(config)


# ---- the command ----

def check_bench_args(args: argparse.Namespace) -> None:
    """What can be checked before any work: numeric flags, the target URL, the engine
    settings, the cost model or the model name, output paths."""
    check_flags(args, BENCH_FLAGS)
    if args.target:
        check_url(args.target)
    else:
        _engine_config(args)
    if args.sim:
        from stepserve.sim.commands import _cost_model

        _cost_model(args)
    if args.engine:
        from stepserve.model.presets import resolve_model

        try:  # the same lookup the engine makes; a preset is built here, once
            resolve_model(args.model or "tiny")
        except (ValueError, FileNotFoundError) as e:
            raise UsageError(f"--model: {e}") from None
    for flag in OUTPUT_FLAGS:
        check_output_file(f"--{flag}", getattr(args, flag))


@reports_usage_errors
def run_bench(args: argparse.Namespace) -> int:
    check_bench_args(args)
    try:
        slo = parse_slo(args.goodput)
        workload = build_workload(args)
        specs = make_specs(args, workload)
    except (BenchError, SLOError, WorkloadError, ValueError) as e:
        return report_error(e)
    plan = LoadPlan(specs, workload.closed_loop_concurrency, args.warmup, args.duration_s,
                    args.text_prompts, args.ignore_eos)
    how = workload.describe()
    if args.request_rate is not None and math.isinf(args.request_rate):
        how = how.replace(workload.arrival.describe(), "all sent at once (rate inf)")
    print(f"{how}\n{len(specs)} requests ({args.warmup} warm-up)", file=sys.stderr)
    try:
        return _run(args, plan, slo, workload)
    except (BenchError, ConfigError, WorkloadError, ValueError, OSError) as e:
        return report_error(e)


def _run(args, plan: LoadPlan, slo: SLO, workload: Workload) -> int:
    run: dict[str, Any] = {"name": workload.name}
    interrupted = [False]
    bar = _progress(len(plan.specs), not args.no_progress)
    extra: dict = {}
    started = time.time()
    try:
        if args.target:
            run["target"] = args.target
            records = make_records(plan)
            http = HttpRun()
            try:
                asyncio.run(bench_http(args.target, args.model, plan, records, http,
                                       timeout_s=args.timeout_s,
                                       metrics_interval_s=args.metrics_interval_s,
                                       on_done=lambda r: bar.update()))
            except KeyboardInterrupt:
                interrupted[0] = True
            run["model"] = http.model or args.model
            run["config"] = http.server_config()
            extra = http.scrape
            run.update(http_extras(records, http.snapshots))
        elif args.sim:
            from stepserve.bench.inprocess import run_sim

            config = _engine_config(args)
            cost, blocks = _sim_cost(args, config)
            records, extra, sim_run = run_sim(plan, config, cost, blocks)
            run.update(target="sim", batching=sim_run["batching"], config=sim_run["config"],
                       timeseries=sim_run["timeseries"],
                       cost_model=cost.describe())
            bar.update(len(records))
        else:
            from stepserve.bench.inprocess import run_engine
            from stepserve.engine.llm_engine import LLMEngine

            config = _engine_config(args)
            engine = LLMEngine(args.model or "tiny", config)
            run.update(target="engine", model=args.model or "tiny",
                       batching=config.scheduler.batching)
            records, extra, plots = run_engine(plan, engine, lambda r: bar.update(),
                                               interrupted)
            run.update(config=config_to_dict(config), **plots)
    finally:
        bar.close()
    return _report(args, run, records, slo, extra, interrupted[0], started)


def _report(args, run: dict, records: list[RequestRecord], slo: SLO, extra: dict,
            interrupted: bool, started: float) -> int:
    run.setdefault("latency_samples", latency_samples(records))
    summary = summarize_records(records, slo, None, interrupted)
    summary.update(extra)
    run["started_at"] = started
    run["summary"] = summary
    result = {"runs": [run], "findings": findings_for([run])}
    print(format_table(run["name"], summary))
    for f in result["findings"]:
        print(f"[{f['severity']}] {f['rule']}: {f['evidence']}")
    for flag, write, what in ((args.json, write_json, result), (args.csv, write_csv, records),
                              (args.markdown, write_markdown, result)):
        if flag:
            write(flag, what)
            print(f"wrote {flag}")
    if summary["requests_total"] and not summary["requests_finished"] and args.target:
        print("warning: no request completed; see errors above", file=sys.stderr)
    if interrupted:
        print("interrupted: the result above and any files written are partial",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def main(argv: list[str] | None = None) -> int:
    """For tests and `python -m stepserve.bench.commands` until cli.py wires it."""
    parser = argparse.ArgumentParser(prog="stepserve")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
