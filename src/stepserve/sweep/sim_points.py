"""Run every sweep point on the simulator, each on the same fixed request count.

A point's result is a SweepPointResult: the RunResult `stepserve simulate` makes (its
time series over the whole run; its summary and latency samples over the point's steady
window, sweep/window.py) and where the point sits in the grid (series, x and axis
values).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from stepserve.config.settings import EngineConfig
from stepserve.metrics.run_summary import RunSummary
from stepserve.sim.cost import CostModel
from stepserve.sim.run import simulate_run
from stepserve.sweep.result import SweepCoords, SweepPointResult
from stepserve.sweep.spec import SweepPoint
from stepserve.sweep.window import STEADY, WindowRule, windowed_run
from stepserve.workload.arrivals import ClosedLoop, Constant, Gamma, Poisson
from stepserve.workload.overrides import WorkloadOverrides, override_workload
from stepserve.workload.spec import Workload

# A point's steady window (sweep/window.py) needs arrivals for a while: at 96 req/s the
# default 600 requests arrive in 6 s, less than one long request's life. Past
# MAX_SIZED_REQUESTS a point is as long as the user makes it (--requests, --duration-s).
MIN_SPAN_S = 60.0
MAX_SIZED_REQUESTS = 20_000


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


def timed_workload(workload: Workload, duration_s: float | None,
                   live: bool = False) -> Workload:
    """The workload cut to `duration_s` of arrivals (a point run for a fixed time).

    Open loop: as many requests as the rate brings in that time (generated with a wide
    margin, then cut at `duration_s`); a trace: its requests up to `duration_s`. Closed
    loop has no arrival times: against a live server the load generator stops issuing at
    `duration_s` (LoadPlan.duration_s); on the simulator it is refused."""
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


def run_points(points: list[SweepPoint],
               make_workload: Callable[[WorkloadOverrides], Workload],
               cost_model: CostModel, blocks_for_config: Callable[[EngineConfig], int],
               log: Callable[[str], None] | None = None,
               pools: Mapping[str, Any] | None = None,
               window: WindowRule = STEADY
               ) -> tuple[list[SweepPointResult], str | None]:
    """Simulate each point (with `pools`: the pools file's deployment over its config),
    measured over `window`. Points with the same load share one generated request list.
    Returns (runs, "interrupted" or None): Ctrl-C keeps the points simulated before it."""
    runs: list[SweepPointResult] = []
    try:
        _simulate(points, make_workload, cost_model, blocks_for_config, log, runs, pools,
                  window)
    except KeyboardInterrupt:
        return runs, "interrupted"
    return runs, None


def _simulate(points, make_workload, cost_model, blocks_for_config, log, runs,
              pools, window: WindowRule) -> None:
    specs_cache: dict[WorkloadOverrides, tuple[Workload, list]] = {}
    for i, p in enumerate(points, 1):
        key = p.workload_overrides
        if key not in specs_cache:
            workload = make_workload(p.workload_overrides)
            specs_cache[key] = (workload, workload.generate())
        workload, specs = specs_cache[key]
        started = time.perf_counter()
        whole, sim = simulate_run(p.label, p.config, specs, cost_model,
                                  blocks_for_config(p.config),
                                  workload.closed_loop_concurrency, pools=pools)
        run, measured = windowed_run(whole, sim, window)
        runs.append(SweepPointResult(run, SweepCoords(p.series, p.run, p.x, p.values),
                                     measured))
        if log:
            s = run.summary
            log(progress_line(i, len(points), p, s, f"preemptions {s.preemptions}", started))


def progress_line(i: int, n: int, point: SweepPoint, s: RunSummary, detail: str,
                  started: float) -> str:
    """The log line of a finished point: its throughput, E2E P99, `detail`, its time."""
    tokens = "-" if s.throughput_tokens_per_s is None else f"{s.throughput_tokens_per_s:.0f}"
    e2e = "-" if s.e2e_p99_s is None else f"{s.e2e_p99_s:.2f} s"
    return (f"[{i}/{n}] {point.label}: {tokens} tok/s, e2e P99 {e2e}, {detail} "
            f"({time.perf_counter() - started:.1f} s)")


def stderr_log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)

