"""The same workload without HTTP: through the real engine in this process (`--engine`)
or the simulator on a virtual clock (`--sim`). Both give RequestRecords, so the summary
has the same keys whatever the target; the engine's own step keys stand in for /metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from stepserve.bench.client import RequestRecord
from stepserve.bench.loadgen import SCRAPE_KEYS, LoadPlan, SendWindow
from stepserve.bench.prompt_maker import repeated_tokens, token_prompt
from stepserve.config.errors import UsageError
from stepserve.config.settings import EngineConfig
from stepserve.core.end_reasons import end_of
from stepserve.core.output import StepRecord
from stepserve.core.request import Request, SamplingParams
from stepserve.host.cpu_share import CpuWatch
from stepserve.metrics.run_summary import REQUEST_FIELDS, STEP_FIELDS, RunSummary
from stepserve.metrics.step_metrics import TimeSeries
from stepserve.metrics.summary import step_timeseries, summarize

if TYPE_CHECKING:
    from stepserve.sim.run import RunResult


def record_of(req: Request, index: int, warmup: bool, scheduled_s: float, t0: float,
              request_class: str = "default", repeated_tokens: int | None = None
              ) -> RequestRecord:
    """A request the engine ran, as the client would have seen it (times from t0): the
    HTTP status the server answers its end with (end_reasons.py), or 200 and an error in
    the stream once its first token was out (the server's status is sent with it)."""
    reason = req.finish_reason.value if req.finish_reason else None
    times = [t - t0 for t in req.token_times]
    end = req.finish_time if req.finish_time is not None else \
        (req.token_times[-1] if req.token_times else None)
    how = end_of(req.finish_reason, req.reject_reason) if req.is_finished else None
    ok = how is not None and how.completed
    status = None if how is None else 200 if ok or times else how.http_status
    return RequestRecord(
        index=index, request_class=request_class, prompt_len=req.num_prompt_tokens,
        max_tokens=req.sampling_params.max_tokens, warmup=warmup, scheduled_s=scheduled_s,
        send_s=req.arrival_time - t0, end_s=None if end is None else end - t0,
        chunk_times_s=times, output_tokens=len(req.output_token_ids),
        prompt_tokens=req.num_prompt_tokens, finish_reason=reason,
        cached_tokens=req.num_cached_tokens, repeated_tokens=repeated_tokens, status=status,
        error=None if ok else f"{reason or 'unfinished'}: {req.finish_message}".strip())


def engine_keys(full: RunSummary) -> RunSummary:
    """The scrape fields (and the step fields) from the engine's own summary: the bench
    computes its own request fields from the records, so those are left out."""
    own = ("output_tokens", "prompt_tokens", "duration_s", "prefix_cache_hit_rate",
           "prefix_repeated_share")
    kept = tuple(k for k in REQUEST_FIELDS + STEP_FIELDS if k not in own
                 and not k.startswith(("requests_", "throughput_"))
                 and k.split("_")[0] not in ("ttft", "tpot", "itl", "e2e", "p99"))
    out = full.only(kept).with_values(
        server_requests_finished=full.requests_finished,
        server_generation_tokens=full.output_tokens,
        server_prompt_tokens=full.prompt_tokens, scrape_samples=0, metrics_source="engine")
    assert all(k in out.reported for k in SCRAPE_KEYS)
    return out


def run_sim(plan: LoadPlan, config: EngineConfig, cost_model, num_gpu_blocks: int,
            http_s: Sequence[float] | None = None
            ) -> tuple[list[RequestRecord], RunSummary, RunResult]:
    """(records, engine keys, the simulator's run result: its summary measured once
    feeds the engine keys, its binned step records the bench's time series). `http_s`:
    each request's HTTP path time (a target's measured floor, sim/spread.py), by plan
    index, added to what its client sees: its tokens and its end come that much later."""
    from stepserve.sim.run import simulate_run

    run, sim = simulate_run("sim", config, plan.specs, cost_model, num_gpu_blocks, plan.concurrency)
    by_id = {r.request_id: r for r in sim.requests}
    repeated = repeated_tokens(plan.specs)
    records = [record_of(by_id[str(s.index)], s.index, i < plan.warmup, s.arrival_s, 0.0,
                         s.request_class, repeated[i])
               for i, s in enumerate(plan.specs) if str(s.index) in by_id]
    if http_s is not None:
        late = {s.index: http_s[i] for i, s in enumerate(plan.specs)}
        for rec in records:
            rec.chunk_times_s = [t + late[rec.index] for t in rec.chunk_times_s]
            if rec.end_s is not None:
                rec.end_s += late[rec.index]
    return records, engine_keys(run.summary), run


def run_engine(plan: LoadPlan, engine, on_done: Callable[[RequestRecord], None] | None = None,
               interrupted: list[bool] | None = None
               ) -> tuple[list[RequestRecord], RunSummary, TimeSeries | None]:
    """Drive `engine` (an LLMEngine) with the plan's arrivals on the wall clock: issue what
    is due and step, until every request issued has ended. Returns (records, engine keys,
    binned step records or None). A KeyboardInterrupt stops the run; what ended so far
    is returned and `interrupted[0]` is set."""
    if any(spec.turn for spec in plan.specs):  # its load sends every spec at its arrival
        raise UsageError("multi_turn sessions run against a server (--target) or the "
                         "simulator (--sim), not the in-process engine (--engine)")
    done = on_done or (lambda r: None)
    clock, specs = engine.clock, plan.specs
    t0 = clock.now()
    window = SendWindow(plan, clock.now)
    closed = plan.concurrency is not None
    issued: list[tuple[int, Request]] = []  # with their index in the plan
    steps: list[StepRecord] = []
    live = next_i = 0  # live: issued and not yet ended
    n = len(specs)  # lowered when the plan's duration runs out
    cpu = CpuWatch.start()  # the engine's threads are this process's
    try:
        while True:
            now = clock.now()
            # every request whose arrival is due (open loop); with a concurrency, only
            # while a slot is free, arriving now (rate inf: a closed loop)
            while next_i < n and t0 + specs[next_i].arrival_s <= now and \
                    not (closed and live >= plan.concurrency):
                if not window.allows(next_i):
                    n = next_i
                    break
                spec = specs[next_i]
                params = SamplingParams(max_tokens=spec.max_tokens, temperature=0.0,
                                        ignore_eos=plan.ignore_eos, priority=spec.priority,
                                        tenant=spec.tenant)
                req = engine.add_request(token_prompt(spec, engine.runner.args.vocab_size),
                                         params, request_id=f"bench-{spec.index}",
                                         arrival_time=now if closed else t0 + spec.arrival_s)
                issued.append((next_i, req))
                next_i += 1
                if not req.is_finished:
                    live += 1
                else:  # refused at admission
                    done(RequestRecord(index=-1))
            if engine.has_unfinished():
                result = engine.step()
                if result.ran:
                    steps.append(result.record)
                live -= len(result.finished)
                for _ in result.finished:
                    done(RequestRecord(index=-1))
            elif next_i < n:
                time.sleep(max(0.0, min(0.05, t0 + specs[next_i].arrival_s - now)))
            else:
                break
    except KeyboardInterrupt:
        if interrupted is not None:
            interrupted[0] = True
    repeated = repeated_tokens(specs)
    records = []
    for i, req in issued:  # as the client would have seen them
        rec = record_of(req, specs[i].index, i < plan.warmup, specs[i].arrival_s, t0,
                        specs[i].request_class, repeated[i])
        if not req.is_finished:  # cut short by an interrupt
            rec.error, rec.status = "interrupted before the response ended", 200
        records.append(rec)
    series = step_timeseries(steps, t0=t0) if steps else None
    full = summarize([r for _, r in issued], steps, clock.now() - t0)
    return records, engine_keys(full).with_values(**cpu.fields("engine", steps)), series
