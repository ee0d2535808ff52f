"""Everything measured of one run, each measured once: the summary, the by-class
summaries, a binned time series of the step records and thinned latency samples (TTFT
and E2E). Result files store the last two under `timeseries` and `latency_samples` so
`stepserve report` can draw time series and CDFs from a file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from stepserve.core.request import Request
from stepserve.metrics.request_metrics import RequestLatencies, measure_requests
from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.step_metrics import Steps, TimeSeries, per_replica, timeseries
from stepserve.metrics.summary import by_class, summarize_latencies

SAMPLE_CAP = 5000
TIMESERIES_BINS = 200


def thin(values: list[float], cap: int) -> list[float]:
    """Sorted values, cut to `cap` evenly spaced order statistics (the CDF's shape)."""
    values = sorted(values)
    if len(values) <= cap:
        return values
    step = (len(values) - 1) / (cap - 1)
    return [values[round(i * step)] for i in range(cap)]


@dataclass(frozen=True)
class LatencySamples:
    """TTFT and E2E of completed requests (seconds), each thinned to at most `cap`
    sorted values, out of `count` completed requests (`capped` when thinned)."""

    ttft_s: list[float]
    e2e_s: list[float]
    count: int
    capped: bool

    def to_json(self) -> dict[str, Any]:
        return {"ttft_s": list(self.ttft_s), "e2e_s": list(self.e2e_s), "count": self.count,
                "capped": self.capped}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LatencySamples:
        ttft, e2e = data["ttft_s"], data["e2e_s"]
        if not isinstance(ttft, list) or not isinstance(e2e, list):
            raise ValueError("latency_samples.ttft_s and .e2e_s must be lists")
        count = data.get("count", len(ttft))
        return cls(ttft, e2e, count, bool(data.get("capped", False)))


def sample_set(ttft: list[float], e2e: list[float], count: int,
               cap: int = SAMPLE_CAP) -> LatencySamples:
    """TTFT and E2E thinned to `cap` values each, out of `count` completed requests."""
    return LatencySamples(thin(ttft, cap), thin(e2e, cap), count, count > cap)


def latency_samples(ms: Sequence[RequestLatencies], cap: int = SAMPLE_CAP) -> LatencySamples:
    done = [m for m in ms if m.completed]
    return sample_set([m.ttft_s for m in done if m.ttft_s is not None],
                      [m.e2e_s for m in done if m.e2e_s is not None], len(done), cap)


def step_timeseries(steps: Steps, bins: int = TIMESERIES_BINS, t0: float = 0.0
                    ) -> TimeSeries:
    """The binned step records (step_metrics.timeseries) with `steps`, the step records
    per bin; from a simulation or an engine. Never more bins than steps (a short run
    would be mostly empty bins); times are seconds after `t0` (the run's start on an
    engine's clock)."""
    bins = max(1, min(bins, sum(len(r) for r in per_replica(steps))))
    ts = timeseries(steps, bins=bins)
    return replace(ts, t=[t - t0 for t in ts.t], steps=_steps_per_bin(steps, bins))


def _steps_per_bin(steps: Steps, bins: int) -> list[int]:
    # same binning as step_metrics.timeseries: by each step's end time
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


@dataclass(frozen=True)
class RunMetrics:
    """One run measured: `by_class` only when its requests have more than one class."""

    summary: RunSummary
    by_class: dict[str, RunSummary] | None
    timeseries: TimeSeries
    latency_samples: LatencySamples


def measure_run(requests: Sequence[Request], steps: Steps, duration_s: float, *,
                bins: int = TIMESERIES_BINS, cap: int = SAMPLE_CAP) -> RunMetrics:
    """Every request measured once; the summary, the classes and the samples share it."""
    ms = measure_requests(requests)  # with each prompt's repeat of an earlier one
    several = len({r.request_class for r in requests}) > 1
    return RunMetrics(summary=summarize_latencies(ms, steps, duration_s),
                      by_class=by_class(ms, duration_s) if several else None,
                      timeseries=step_timeseries(steps, bins),
                      latency_samples=latency_samples(ms, cap))
