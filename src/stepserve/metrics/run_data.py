"""Per-run data for plots: a binned time series of the step records and thinned latency
samples (TTFT and E2E), stored in result JSON under `timeseries` and `latency_samples`
so `stepserve report` can draw time series and CDFs from a file."""

from __future__ import annotations

from typing import Any

from stepserve.metrics.request_metrics import request_metrics
from stepserve.metrics.step_metrics import per_replica
from stepserve.metrics.summary import timeseries

SAMPLE_CAP = 5000
TIMESERIES_BINS = 200


def thin(values: list[float], cap: int) -> list[float]:
    """Sorted values, cut to `cap` evenly spaced order statistics (the CDF's shape)."""
    values = sorted(values)
    if len(values) <= cap:
        return values
    step = (len(values) - 1) / (cap - 1)
    return [values[round(i * step)] for i in range(cap)]


def run_extras(sim, bins: int = TIMESERIES_BINS,
               cap: int = SAMPLE_CAP) -> dict[str, Any]:
    """{"timeseries", "latency_samples"} for one simulation: what `stepserve report`
    needs for time series and CDFs. timeseries also carries `steps` (step records per bin,
    all replicas) so tokens per step can be drawn."""
    ts = step_timeseries(sim.steps, bins)
    done = [m for m in map(request_metrics, sim.requests) if m.completed]
    ttft = [m.ttft_s for m in done if m.ttft_s is not None]
    e2e = [m.e2e_s for m in done if m.e2e_s is not None]
    return {"timeseries": ts, "latency_samples": sample_set(ttft, e2e, len(done), cap)}


def sample_set(ttft: list[float], e2e: list[float], count: int,
               cap: int = SAMPLE_CAP) -> dict[str, Any]:
    """The `latency_samples` of a result run: TTFT and E2E thinned to `cap` values each,
    out of `count` completed requests."""
    return {"ttft_s": thin(ttft, cap), "e2e_s": thin(e2e, cap), "count": count,
            "capped": count > cap}


def step_timeseries(steps, bins: int = TIMESERIES_BINS, t0: float = 0.0
                    ) -> dict[str, list]:
    """The binned step records (metrics.step_metrics.timeseries) plus `steps`, the step
    records per bin, so tokens per step can be drawn; from a simulation or an engine.
    Never more bins than steps (a short run would be mostly empty bins); times are
    seconds after `t0` (the run's start on an engine's clock)."""
    bins = max(1, min(bins, sum(len(r) for r in per_replica(steps))))
    ts = timeseries(steps, bins=bins).to_dict()
    ts["t"] = [t - t0 for t in ts["t"]]
    ts["steps"] = _steps_per_bin(steps, bins)
    return ts


def _steps_per_bin(steps, bins: int) -> list[int]:
    # same binning as metrics.step_metrics.timeseries: by each step's end time
    recs = [s for r in per_replica(steps) for s in r]
    if not recs:
        return []
    t0 = min(s.start_s for s in recs)
    t1 = max(s.start_s + s.duration_s for s in recs)
    width = (t1 - t0) / bins or 1.0
    counts = [0] * bins
    for s in recs:
        counts[min(int((s.start_s + s.duration_s - t0) / width), bins - 1)] += 1
    return counts
