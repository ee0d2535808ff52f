"""Measure a sweep's points: on the simulator (each over its steady window,
sweep/window.py), against a live server (`--target`: one bench run per point, /metrics
sampled alongside), and with `--predict` the live points again on the simulator, a
second series ("predicted"), on the settings the server publishes over the engine flags
given and the KV pool the cost file records. Ctrl-C keeps the points measured before it
(the one cut off is dropped: a partial point would put a false value on the curve).
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stepserve.bench.loadgen import HttpRun, LoadPlan, bench_http, make_records
from stepserve.bench.results import BenchRun, latency_samples, scrape_timeseries, summarize_records
from stepserve.bench.workload_options import BenchError
from stepserve.config.settings import EngineConfig
from stepserve.sim.cost import CostModel
from stepserve.sim.cost_options import CostModelOptions, cost_setup_for
from stepserve.sim.run import run_config, simulate_run
from stepserve.sweep.knee import KneeResult
from stepserve.sweep.result import SweepCoords, SweepPointResult
from stepserve.sweep.spec import SweepPoint
from stepserve.sweep.window import STEADY, WindowRule, windowed_run
from stepserve.workload.arrivals import ClosedLoop, Constant, Gamma, Poisson
from stepserve.workload.overrides import WorkloadOverrides, override_workload
from stepserve.workload.spec import Workload

# A point's steady window needs arrivals for a while: at 96 req/s the default 600
# requests arrive in 6 s, less than one long request's life. Past MAX_SIZED_REQUESTS a
# point is as long as the user makes it (--requests, --duration-s).
MIN_SPAN_S = 60.0
MAX_SIZED_REQUESTS = 20_000
PREDICTED = "predicted"
# the scheduler settings a stepserve server publishes (scheduler_config_info)
PUBLISHED = ("batching", "max_num_seqs", "max_num_batched_tokens",
             "long_prefill_token_threshold", "max_num_partial_prefills", "budget_order")
Log = Callable[[str], None]
MakeWorkload = Callable[[WorkloadOverrides], Workload]


@dataclass(frozen=True)
class LiveOptions:
    """How each point is benched against a live server (`--target` and its flags)."""

    target: str
    model: str | None = None  # default: the first of /v1/models
    warmup: int = 0  # per point, the first N requests are left out of the metrics
    timeout_s: float = 600.0  # per request
    metrics_interval_s: float = 0.25  # 0: never scrape /metrics


def sized_workload(workload: Workload, min_span_s: float | None) -> Workload:
    """A rated workload with at least `min_span_s` of arrivals (its count raised to rate x
    span where that is more); any other, or None, as it is."""
    arrival = workload.arrival
    if min_span_s is None or not isinstance(arrival, (Poisson, Gamma, Constant)):
        return workload
    need = min(math.ceil(arrival.rate_per_s * min_span_s), MAX_SIZED_REQUESTS)
    if need <= workload.num_requests:
        return workload
    return override_workload(workload, WorkloadOverrides(num_requests=need))


def timed_workload(workload: Workload, duration_s: float | None, live: bool = False) -> Workload:
    """The workload cut to `duration_s` of arrivals. Open loop: as many requests as the
    rate brings in that time (generated with a wide margin, then cut); a trace: its
    requests up to then. A closed loop has no arrival times: against a live server the
    load generator stops issuing at `duration_s`; on the simulator it is refused."""
    if duration_s is None:
        return workload
    if duration_s <= 0:
        raise ValueError(f"--duration-s {duration_s:g}: must be > 0")
    arrival = workload.arrival
    if isinstance(arrival, ClosedLoop):
        if not live:
            raise ValueError("--duration-s: a closed-loop workload on the simulator runs a "
                             "request count; give --requests (or sweep a live --target)")
        return workload
    if isinstance(arrival, (Poisson, Gamma, Constant)):
        count = math.ceil(arrival.rate_per_s * duration_s * 1.5) + 16
        return override_workload(workload, WorkloadOverrides(num_requests=count,
                                                             duration_s=duration_s))
    return override_workload(workload, WorkloadOverrides(duration_s=duration_s))


def _each_point(points: list[SweepPoint], measure: Callable[[SweepPoint], tuple[
                SweepPointResult, str]], log: Log | None, live: bool = False
                ) -> tuple[list[SweepPointResult], str | None]:
    """`measure` each point, logging its line. Returns (runs, why it stopped early): None
    when every point ran, "interrupted" on Ctrl-C, or the error when a live target became
    unreachable after the first point (before it, the BenchError propagates)."""
    runs: list[SweepPointResult] = []
    for i, p in enumerate(points, 1):
        started = time.perf_counter()
        try:
            run, detail = measure(p)
        except KeyboardInterrupt:
            if log and live:
                log(f"[{i}/{len(points)}] {p.label}: interrupted; keeping the "
                    f"{len(runs)} point(s) measured before it")
            return runs, "interrupted"
        except BenchError as e:
            if not runs:
                raise
            return runs, f"stopped at {p.label}: {e}"
        runs.append(run)
        if log:
            s = run.summary
            tokens = "-" if s.throughput_tokens_per_s is None \
                else f"{s.throughput_tokens_per_s:.0f}"
            e2e = "-" if s.e2e_p99_s is None else f"{s.e2e_p99_s:.2f} s"
            log(f"[{i}/{len(points)}] {p.label}: {tokens} tok/s, e2e P99 {e2e}, {detail} "
                f"({time.perf_counter() - started:.1f} s)")
    return runs, None


def run_points(points: list[SweepPoint], make_workload: MakeWorkload,
               cost_model: CostModel, blocks_for_config: Callable[[EngineConfig], int],
               log: Log | None = None, pools: Mapping[str, Any] | None = None,
               window: WindowRule = STEADY) -> tuple[list[SweepPointResult], str | None]:
    """Simulate each point (with `pools`: the pools file's deployment over its config),
    measured over `window`. Points with the same load share one generated request list."""
    specs_cache: dict[WorkloadOverrides, tuple[Workload, list]] = {}

    def measure(p: SweepPoint) -> tuple[SweepPointResult, str]:
        if p.workload_overrides not in specs_cache:
            workload = make_workload(p.workload_overrides)
            specs_cache[p.workload_overrides] = (workload, workload.generate())
        workload, specs = specs_cache[p.workload_overrides]
        whole, sim = simulate_run(p.label, p.config, specs, cost_model,
                                  blocks_for_config(p.config),
                                  workload.closed_loop_concurrency, pools=pools)
        run, measured = windowed_run(whole, sim, window)
        return (SweepPointResult(run, SweepCoords(p.series, p.run, p.x, p.values), measured),
                f"preemptions {run.summary.preemptions}")

    return _each_point(points, measure, log)


def run_target_points(live: LiveOptions, points: list[SweepPoint], make_workload: MakeWorkload,
                      duration_s: float | None = None, log: Log | None = None
                      ) -> tuple[list[SweepPointResult], str | None]:
    """Bench each point against the target (a closed loop stops issuing after
    `duration_s`)."""

    def measure(p: SweepPoint) -> tuple[SweepPointResult, str]:
        workload = make_workload(p.workload_overrides)
        duration = duration_s if workload.closed_loop_concurrency else None
        plan = LoadPlan(workload.generate(), workload.closed_loop_concurrency, live.warmup,
                        duration)
        records = make_records(plan)
        http = HttpRun()
        asyncio.run(bench_http(live.target, live.model, plan, records, http,
                               timeout_s=live.timeout_s,
                               metrics_interval_s=live.metrics_interval_s))
        summary = summarize_records(records, scrape=http.scrape)
        run = BenchRun(p.label, summary, target=live.target, model=http.model,
                       config=http.server_config(), workload=workload.describe(),
                       latency_samples=latency_samples(records),
                       timeseries=scrape_timeseries(http.snapshots))
        failed = summary.requests_failed
        return (SweepPointResult(run, SweepCoords(p.series, p.run, p.x, p.values)),
                f"{summary.requests_finished}/{summary.requests_total} done"
                f"{f', {failed} failed' if failed else ''}")

    return _each_point(points, measure, log, live=True)


def predict_points(cost_file: str, base: EngineConfig, points: Sequence[SweepPoint],
                   measured: Sequence[SweepPointResult], make_workload: MakeWorkload,
                   log: Log | None = None) -> list[SweepPointResult]:
    """The measured points again on the simulator, one per point measured (every request
    counted: a live point's warm-up is left out of its metrics only)."""
    published = next((r.result.config for r in measured if getattr(r.result, "config", None)),
                     None) or {}
    given = {k: published[k] for k in PUBLISHED if published.get(k) not in (None, "")}
    config = base.replace(**given) if given else base
    setup = cost_setup_for(CostModelOptions(cost=cost_file))
    blocks = setup.num_gpu_blocks(config)
    out = []
    for p in points[:len(measured)]:
        workload = make_workload(p.workload_overrides)
        run = run_config(f"{PREDICTED} {p.label}", config, workload.generate(),
                         setup.cost_model, blocks, workload.closed_loop_concurrency)
        out.append(SweepPointResult(run, SweepCoords(PREDICTED, PREDICTED, p.x, p.values)))
        if log:
            s = run.summary
            log(f"predicted {p.label}: {s.throughput_tokens_per_s or 0:.0f} tok/s, "
                f"ttft P99 {s.ttft_p99_s or 0:.2f} s")
    return out


def agreement(knees: Sequence[KneeResult]) -> str | None:
    """One line: where the measured and the predicted series recommend, and whether that
    is the same operating point (within one grid step); None without both."""
    predicted = next((k for k in knees if k.series == PREDICTED), None)
    measured = next((k for k in knees if k.series != PREDICTED), None)
    if predicted is None or measured is None:
        return None
    m, p = measured.recommended_index, predicted.recommended_index
    if m is None or p is None:
        return "measured vs predicted: one of them recommends no point"
    apart = abs(m - p)
    verdict = "the same point" if apart == 0 else \
        "within one grid step" if apart == 1 else f"{apart} grid steps apart"
    return (f"measured recommends {measured.xs[m]}, predicted {predicted.xs[p]}: {verdict}"
            f" (knee measured {measured.knee_x}, predicted {predicted.knee_x})")


def stderr_log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
