"""`stepserve sweep --target URL`: the load axes (request rate, concurrency, seed) swept
against a running OpenAI-compatible server, one bench run per point.

A live server's engine settings are its own, so only workload axes may vary; config
files, scenario runs and engine flags are refused with a message saying so (the sweep's
checks, sweep/job.py). Each point
is a full `stepserve bench --target` run (bench.http_run): the client's TTFT, TPOT, ITL,
E2EL and throughput, the target's /metrics sampled alongside, and the plot data of
bench.results. Ctrl-C stops the sweep; the points already measured are kept (the one
cut off is dropped, as a partial point would put a false value on the curve).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from stepserve.bench.http_run import HttpRun, bench_http
from stepserve.bench.loadgen import LoadPlan, make_records
from stepserve.bench.results import BenchRun, http_extras, summarize_records
from stepserve.bench.workload_options import BenchError
from stepserve.sim.scenarios import RunSpec
from stepserve.sweep.result import SweepCoords, SweepPointResult
from stepserve.sweep.sim_points import progress_line
from stepserve.sweep.spec import SweepPoint, build_points
from stepserve.workload.overrides import WorkloadOverrides
from stepserve.workload.spec import Workload


@dataclass(frozen=True)
class LiveOptions:
    """How each point is benched against a live server (`--target` and its flags)."""

    target: str
    model: str | None = None  # default: the first of /v1/models
    warmup: int = 0  # per point, the first N requests are left out of the metrics
    timeout_s: float = 600.0  # per request
    metrics_interval_s: float = 0.25  # 0: never scrape /metrics


def target_points(target: str, axes: list) -> tuple[str, list[SweepPoint]]:
    """One series (named after the target) along the last axis; its config is unused."""
    from stepserve.config.settings import EngineConfig

    return build_points([RunSpec("server", EngineConfig(), target)], axes)


def run_target_points(live: LiveOptions, points: list[SweepPoint],
                      make_workload: Callable[[WorkloadOverrides], Workload],
                      duration_s: float | None = None,
                      log: Callable[[str], None] | None = None
                      ) -> tuple[list[SweepPointResult], str | None]:
    """Bench each point against the target (a closed loop stops issuing after
    `duration_s`). Returns (runs, why it stopped early): None when every point ran,
    "interrupted" on Ctrl-C, or the error when the target became unreachable after the
    first point (before it, the BenchError propagates)."""
    runs: list[SweepPointResult] = []
    for i, p in enumerate(points, 1):
        workload = make_workload(p.workload_overrides)
        specs = workload.generate()
        duration = duration_s if workload.closed_loop_concurrency else None
        plan = LoadPlan(specs, workload.closed_loop_concurrency, live.warmup, duration)
        records = make_records(plan)
        http = HttpRun()
        started = time.perf_counter()
        try:
            asyncio.run(bench_http(live.target, live.model, plan, records, http,
                                   timeout_s=live.timeout_s,
                                   metrics_interval_s=live.metrics_interval_s))
        except KeyboardInterrupt:
            if log:
                log(f"[{i}/{len(points)}] {p.label}: interrupted; keeping the "
                    f"{len(runs)} point(s) measured before it")
            return runs, "interrupted"
        except BenchError as e:
            if not runs:
                raise
            return runs, f"stopped at {p.label}: {e}"
        summary = summarize_records(records, scrape=http.scrape)
        samples, series = http_extras(records, http.snapshots)
        run = BenchRun(p.label, summary, target=live.target, model=http.model,
                       config=http.server_config(), workload=workload.describe(),
                       latency_samples=samples, timeseries=series)
        runs.append(SweepPointResult(run, SweepCoords(p.series, p.run, p.x, p.values)))
        if log:
            failed = summary.requests_failed
            log(progress_line(i, len(points), p, summary,
                              f"{summary.requests_finished}/{summary.requests_total} done"
                              f"{f', {failed} failed' if failed else ''}", started))
    return runs, None
