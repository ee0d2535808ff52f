"""The same workload without HTTP: through the real engine in this process (`--engine`)
or the simulator on a virtual clock (`--sim`). Both give RequestRecords, so the summary
has the same keys whatever the target; the engine's own step keys stand in for /metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from stepserve.bench.client import RequestRecord
from stepserve.bench.loadgen import LoadPlan, SendWindow
from stepserve.bench.prefix_cache import repeated_tokens
from stepserve.bench.prompt_maker import token_prompt
from stepserve.bench.scrape import SCRAPE_KEYS
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


def run_sim(plan: LoadPlan, config: EngineConfig, cost_model, num_gpu_blocks: int
            ) -> tuple[list[RequestRecord], RunSummary, RunResult]:
    """(records, engine keys, the simulator's run result: its summary measured once
    feeds the engine keys, its binned step records the bench's time series)."""
    from stepserve.sim.run import simulate_run

    run, sim = simulate_run("sim", config, plan.specs, cost_model, num_gpu_blocks,
                            plan.concurrency)
    by_id = {r.request_id: r for r in sim.requests}
    repeated = repeated_tokens(plan.specs)
    records = [record_of(by_id[str(s.index)], s.index, i < plan.warmup, s.arrival_s, 0.0,
                         s.request_class, repeated[i])
               for i, s in enumerate(plan.specs) if str(s.index) in by_id]
    return records, engine_keys(run.summary), run


def run_engine(plan: LoadPlan, engine, on_done: Callable[[RequestRecord], None] | None = None,
               interrupted: list[bool] | None = None
               ) -> tuple[list[RequestRecord], RunSummary, TimeSeries | None]:
    """Drive `engine` (an LLMEngine) with the plan's arrivals on the wall clock. Returns
    (records, engine keys, binned step records or None). A KeyboardInterrupt
    stops the run; what ended so far is returned and `interrupted[0]` is set."""
    if any(spec.turn for spec in plan.specs):  # its load sends every spec at its arrival
        from stepserve.config.errors import UsageError
        raise UsageError("multi_turn sessions run against a server (--target) or the "
                         "simulator (--sim), not the in-process engine (--engine)")
    load = _WallClockLoad(plan, engine, on_done)
    cpu = CpuWatch.start()  # the engine's threads are this process's
    try:
        load.run()
    except KeyboardInterrupt:
        if interrupted is not None:
            interrupted[0] = True
    records = load.records()
    series = step_timeseries(load.steps, t0=load.t0) if load.steps else None
    full = summarize([r for _, r in load.issued], load.steps, load.clock.now() - load.t0)
    return records, engine_keys(full).with_values(**cpu.fields("engine", load.steps)), series


class _WallClockLoad:
    """One run of a plan through an LLMEngine on the wall clock: the requests issued
    (with their index in the plan), the step records, how many are in flight."""

    def __init__(self, plan: LoadPlan, engine,
                 on_done: Callable[[RequestRecord], None] | None) -> None:
        self.plan = plan
        self.engine = engine
        self.on_done = on_done
        self.clock = engine.clock
        self.t0 = self.clock.now()
        self.issued: list[tuple[int, Request]] = []
        self.steps: list[StepRecord] = []
        self.live = 0  # issued and not yet ended
        self.next_i = 0
        self.n = len(plan.specs)  # lowered when the plan's duration runs out
        self.window = SendWindow(plan, self.clock.now)

    def run(self) -> None:
        """Issue what is due and step, until every request issued has ended."""
        while True:
            now = self.clock.now()
            self._issue_due(now)
            if self.engine.has_unfinished():
                self._step()
            elif self.next_i < self.n:
                time.sleep(max(0.0, min(0.05, self._due_at(self.next_i) - now)))
            else:
                return

    def _due_at(self, i: int) -> float:
        return self.t0 + self.plan.specs[i].arrival_s

    def _issue_due(self, now: float) -> None:
        """Every request whose arrival is due (open loop); with a concurrency, only while
        a slot is free, arriving now (rate inf: a closed loop)."""
        closed = self.plan.concurrency is not None
        while self.next_i < self.n and self._due_at(self.next_i) <= now:
            if closed and self.live >= self.plan.concurrency:
                return
            if not self.window.allows(self.next_i):
                self.n = self.next_i
                return
            self._issue(self.next_i, now if closed else self._due_at(self.next_i))
            self.next_i += 1

    def _issue(self, i: int, arrival: float) -> None:
        spec = self.plan.specs[i]
        params = SamplingParams(max_tokens=spec.max_tokens, temperature=0.0,
                                ignore_eos=self.plan.ignore_eos, priority=spec.priority,
                                tenant=spec.tenant)
        prompt = token_prompt(spec, self.engine.runner.args.vocab_size)
        req = self.engine.add_request(prompt, params, request_id=f"bench-{spec.index}",
                                      arrival_time=arrival)
        self.issued.append((i, req))
        if not req.is_finished:
            self.live += 1
        elif self.on_done is not None:  # refused at admission
            self.on_done(RequestRecord(index=-1))

    def _step(self) -> None:
        result = self.engine.step()
        if result.ran:
            self.steps.append(result.record)
        self.live -= len(result.finished)
        if self.on_done is not None:
            for _ in result.finished:
                self.on_done(RequestRecord(index=-1))

    def records(self) -> list[RequestRecord]:
        """Every request issued, as the client would have seen it; one still running was
        cut short by an interrupt."""
        out = []
        repeated = repeated_tokens(self.plan.specs)
        for i, req in self.issued:
            spec = self.plan.specs[i]
            rec = record_of(req, spec.index, i < self.plan.warmup, spec.arrival_s, self.t0,
                            spec.request_class, repeated[i])
            if not req.is_finished:
                rec.error, rec.status = "interrupted before the response ended", 200
            out.append(rec)
        return out
