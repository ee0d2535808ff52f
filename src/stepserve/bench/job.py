"""`stepserve bench`'s job: load a target (an HTTP server, the in-process engine or the
simulator) with a workload and report vLLM's metrics plus the target's own. Exit status:
0 done (server errors are counted, not fatal); 2 bad input or an unreachable target; 130
interrupted (the partial result is still written).
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from dataclasses import dataclass, replace

from stepserve.bench.client import RequestRecord, RequestShape, vllm_defaults_note
from stepserve.bench.loadgen import HttpRun, LoadPlan, bench_http, make_records
from stepserve.bench.prompt_maker import PromptMaker, load_tokenizer
from stepserve.bench.results import (
    BenchResult,
    BenchRun,
    GoodputError,
    GoodputSLO,
    SaveOptions,
    format_table,
    latency_samples,
    offered_load,
    parse_goodput,
    save_vllm_result,
    scrape_timeseries,
    summarize_records,
    vllm_setup,
    write_csv,
    write_json,
    write_markdown,
)
from stepserve.bench.workload_options import (
    BenchError,
    BenchWorkloadOptions,
    build_workload,
    make_specs,
)
from stepserve.config.errors import UsageError, report_error
from stepserve.config.load import ConfigOverrides
from stepserve.config.load import to_dict as config_to_dict
from stepserve.config.settings import ConfigError, EngineConfig
from stepserve.config.urls import check_http_url
from stepserve.config.user_files import OutputFile, check_output_file, write_outputs
from stepserve.metrics.rules import findings_for
from stepserve.metrics.run_summary import RunSummary
from stepserve.sim.cost_options import CostModelOptions, CostSetup, cost_setup_for
from stepserve.sim.run import checked_deployment
from stepserve.sim.target_settings import Note, grouped
from stepserve.workload.errors import WorkloadError
from stepserve.workload.spec import Workload

EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class BenchOptions:
    """One bench run. Exactly one of `target` (a base URL), `engine` or `sim`; `model` is
    sent to the target (default: the first of /v1/models) or, with `engine`, loaded
    (default: tiny). `config` and `cost` apply to the engine and the simulator."""

    target: str | None = None
    engine: bool = False
    sim: bool = False
    model: str | None = None
    workload: BenchWorkloadOptions = BenchWorkloadOptions()
    duration_s: float | None = None  # stop sending after this many seconds
    token_id_prompts: bool = False  # text unless asked
    ignore_eos: bool | None = None  # None: as vLLM, on for random lengths (and our
    # scenarios and workload files, whose lengths are the point), off for ShareGPT
    shape: RequestShape = RequestShape()
    backend: str = "openai"  # vLLM's --backend, as the saved result names it
    goodput: tuple[str, ...] | None = None  # SLO tokens in ms, e.g. ("ttft:500",)
    metrics_interval_s: float = 0.5
    timeout_s: float = 600.0
    json_out: str | None = None
    csv_out: str | None = None
    markdown_out: str | None = None
    progress: bool = True
    config: ConfigOverrides = ConfigOverrides()
    cost: CostModelOptions = CostModelOptions(cost="roofline")
    save: SaveOptions = SaveOptions()


def check_bench_options(options: BenchOptions) -> None:
    """What can be checked before any work (and before a workload file is read): the
    target URL, the engine settings, the cost model and the KV pool or the model name,
    output paths."""
    if options.target:
        check_http_url("--target", options.target)
    elif options.sim:  # its KV pool too, before a trace or ShareGPT file is read
        setup = cost_setup_for(options.cost)
        config = sim_config(options, setup)[0]
        checked_deployment(config, setup.num_gpu_blocks(config), None)
    else:
        options.config.apply()
    if options.engine:
        replicas = options.config.apply().replicas
        if replicas > 1:
            raise UsageError(f"--replicas {replicas}: bench --engine runs one engine in this "
                             f"process; serve {replicas} replicas with `stepserve serve "
                             f"--replicas {replicas}` and bench it with --target URL, or "
                             "simulate them with --sim")
        from stepserve.model.presets import resolve_model

        try:  # the same lookup the engine makes; a preset is built here, once
            resolve_model(options.model or "tiny")
        except (ValueError, FileNotFoundError) as e:
            raise UsageError(f"--model: {e}") from None
    for flag, path in (("--json", options.json_out), ("--csv", options.csv_out),
                       ("--markdown", options.markdown_out)):
        check_output_file(flag, path)
    options.save.check()
    if options.token_id_prompts and options.shape.chat:
        raise UsageError(f"--token-id-prompts: {options.shape.endpoint} takes text only")
    w = options.workload
    if options.sim and w.max_concurrency and w.request_rate is not None and \
            not math.isinf(w.request_rate):
        raise UsageError("--sim runs open or closed loop: --request-rate R with "
                         "--max-concurrency N needs --target or --engine")


def run_bench(options: BenchOptions) -> int:
    """Build the workload, run it, print and write the result; the exit status."""
    check_bench_options(options)
    try:
        slo = parse_goodput(options.goodput)
        workload = build_workload(options.workload)
        specs = make_specs(options.workload, workload)
        # text prompts of exact length need a tokenizer; the engine and the simulator
        # take token ids
        tokenizer = options.workload.tokenizer if options.target else None
        tok = load_tokenizer(tokenizer) if tokenizer and not options.token_id_prompts else None
        prompts = PromptMaker(options.token_id_prompts, tok, workload.seed)
    except (BenchError, GoodputError, WorkloadError, ValueError) as e:  # UsageError too
        return report_error(e)
    w = options.workload
    ignore_eos = options.ignore_eos if options.ignore_eos is not None else w.dataset() != "sharegpt"
    plan = LoadPlan(specs, w.max_concurrency or workload.closed_loop_concurrency, w.warmup,
                    options.duration_s, prompts, ignore_eos, options.shape)
    load = offered_load(options, workload, plan)
    rate = w.offered_rate()  # None: the workload's own times (a trace's included)
    arrivals = "all due at once (rate inf)" if rate is not None and math.isinf(rate) \
        else workload.arrival.describe()
    if plan.concurrency and "in flight" not in arrivals:
        arrivals += f", at most {plan.concurrency} in flight"
    how = workload.describe().replace(workload.arrival.describe(), arrivals, 1)
    print(f"{how}\n{len(specs)} requests ({w.warmup} warm-up)", file=sys.stderr)
    if options.target and (note := vllm_defaults_note(options.shape.sampling, w.dataset(),
                                                      ignore_eos)):
        print(note, file=sys.stderr)
    try:
        return _run(options, plan, slo, workload, load)
    except (BenchError, ConfigError, WorkloadError, ValueError, OSError) as e:
        return report_error(e)


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="bench", unit="req", file=sys.stderr, mininterval=0.5,
                disable=not enabled, leave=False)


def _run(options: BenchOptions, plan: LoadPlan, slo: GoodputSLO, workload: Workload,
         load: dict) -> int:
    interrupted = [False]
    started = time.time()
    # What a Ctrl-C before the load's own handling (the progress bar's import, the
    # engine's model load, the simulator) or after it leaves: nothing sent. The
    # target's records are filled in place, so they keep whatever was measured.
    records = make_records(plan) if options.target else []
    kind = options.target or ("sim" if options.sim else "engine")
    run = BenchRun("", RunSummary(), target=kind, model=options.model)
    measure = _against_target if options.target else _on_sim if options.sim else _on_engine
    bar = None
    try:
        bar = _progress(len(plan.specs), options.progress)
        run, records = measure(options, plan, records, bar, interrupted)
    except KeyboardInterrupt:
        interrupted[0] = True
    finally:
        if bar is not None:
            bar.close()
    if options.target:  # known once the target's model is: its tokenizer may fit them
        load = {**load, "prompts": plan.prompts.describe()}
    summary = summarize_records(records, slo, run.summary, interrupted[0])
    run = replace(run, name=workload.name, summary=summary, started_at=started, load=load,
                  latency_samples=run.latency_samples or latency_samples(records))
    result = BenchResult([run], findings_for([run]))
    print(format_table(run.name, summary))
    for f in result.findings:
        print(f"[{f.severity}] {f.rule}: {f.evidence}")
    setup = vllm_setup(options, run)
    failed = write_outputs([  # one that cannot be written does not stop the rest
        OutputFile("--json", options.json_out, lambda p: write_json(p, result)),
        OutputFile("--csv", options.csv_out, lambda p: write_csv(p, records)),
        OutputFile("--markdown", options.markdown_out, lambda p: write_markdown(p, result)),
        OutputFile("--save-result", options.save.path(setup) if options.save.save else None,
                   lambda p: save_vllm_result(options.save, setup, records, slo))])
    if summary.requests_total and not summary.requests_finished and options.target:
        print("warning: no request completed; see errors above", file=sys.stderr)
    if interrupted[0]:
        print("interrupted: the result above and any files written are partial", file=sys.stderr)
    if failed:
        report_error(failed)
    if interrupted[0]:
        return EXIT_INTERRUPTED
    return 2 if failed else 0


# Each target's run: its summary the target's /metrics fields or the engine's own (the
# client's are added from the records), and the records.
Measured = tuple[BenchRun, list[RequestRecord]]


def _against_target(options: BenchOptions, plan: LoadPlan, records: list[RequestRecord],
                    bar, interrupted: list[bool]) -> Measured:
    """The plan against the target, `records` (from make_records) filled in place."""
    assert options.target is not None
    http = HttpRun()
    load = bench_http(options.target, options.model, plan, records, http,
                      timeout_s=options.timeout_s, headers=options.shape.headers,
                      metrics_interval_s=options.metrics_interval_s,
                      on_done=lambda r: bar.update())
    try:
        asyncio.run(load)
    except KeyboardInterrupt:
        interrupted[0] = True
    finally:  # a Ctrl-C in asyncio.run's own set-up leaves it unstarted: not a warning
        load.close()
    return BenchRun("", http.scrape, target=options.target, model=http.model or options.model,
                    config=http.server_config(),
                    timeseries=scrape_timeseries(http.snapshots)), records


def _on_sim(options: BenchOptions, plan: LoadPlan, _records: list[RequestRecord], bar,
            _interrupted: list[bool]) -> Measured:
    from stepserve.bench.inprocess import run_sim

    setup = cost_setup_for(options.cost)
    config, notes = sim_config(options, setup)
    if setup.layers.active:
        for line in setup.layers.describe() + grouped(notes):
            print(line, file=sys.stderr)
    http = setup.http_floor
    records, extra, sim_run = run_sim(plan, config, setup.cost_model, setup.num_gpu_blocks(config),
                                      None if http is None else
                                      http.draws(len(plan.specs), setup.spread_seed))
    bar.update(len(records))
    return BenchRun("", extra, target="sim", batching=sim_run.batching,
                    config=config_to_dict(config), timeseries=sim_run.timeseries,
                    cost_model=setup.cost_model.describe()), records


def sim_config(options: BenchOptions, setup: CostSetup) -> tuple[EngineConfig, list[Note]]:
    """The simulated engine's settings: the flags over a target profile's and its engine
    kind's (sim/target_settings.py); the notes on where each came from."""
    return setup.layers.config_for(EngineConfig(), options.config, "sim")


def _on_engine(options: BenchOptions, plan: LoadPlan, _records: list[RequestRecord], bar,
               interrupted: list[bool]) -> Measured:
    from stepserve.bench.inprocess import run_engine
    from stepserve.engine.llm_engine import LLMEngine

    # the user's settings, not yet applied: the engine fills the rest from its hardware
    # (on a CPU, the step budget), as `stepserve serve` does
    engine = LLMEngine(options.model or "tiny", options.config)
    config = engine.config
    records, extra, series = run_engine(plan, engine, lambda r: bar.update(), interrupted)
    return BenchRun("", extra, target="engine", model=options.model or "tiny",
                    batching=config.scheduler.batching, config=config_to_dict(config),
                    timeseries=series), records
