"""One run summarised as a RunSummary: request fields from each request's latencies, step
fields from the step records, alert times from both. `measure_run` measures the requests
once and adds the by-class summaries, a binned time series and thinned latency samples.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from stepserve.core.request import FinishReason, Request
from stepserve.metrics.percentiles import mean, percentile, ratio
from stepserve.metrics.request_metrics import RequestLatencies, measure_requests
from stepserve.metrics.rules import alert_times
from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.step_metrics import (
    Steps,
    TimeSeries,
    per_replica,
    step_summary,
    timeseries,
)

__all__ = ["LATENCIES", "LatencySamples", "RunMetrics", "RunSummary", "TimeSeries",
           "by_class", "measure_run", "request_summary", "sample_set", "step_timeseries",
           "summarize", "summarize_by_class", "summarize_latencies", "timeseries"]

LATENCIES = ("ttft", "tpot", "itl", "e2e", "queue_time")
# output tokens; the promo-spike incident's long requests ("输出超过 1,200 token 的请求")
LONG_REQUEST_THRESHOLD = 1200
SAMPLE_CAP = 5000
TIMESERIES_BINS = 200


def _latency_values(done: list[RequestLatencies]) -> dict[str, list[float]]:
    return {
        "ttft": [m.ttft_s for m in done if m.ttft_s is not None],
        "tpot": [m.tpot_s for m in done if m.tpot_s is not None],
        "itl": [gap for m in done for gap in m.itl_s],
        "e2e": [m.e2e_s for m in done if m.e2e_s is not None],
        "queue_time": [m.queue_time_s for m in done if m.queue_time_s is not None],
    }


def latency_fields(values: Mapping[str, list[float]], max_of: tuple[str, ...] = (),
                   given: Mapping[str, float | None] | None = None) -> dict[str, float | None]:
    """{name}_{mean,p50,p95,p99}_s of each name's values ({name}_max_s after them for the
    names in `max_of`), then the P99/P50 ratios of e2e, ttft and tpot: the latency fields
    of a summary, in its order, whoever measured the requests. A field `given` holds a
    number for (another tool's file) is that number."""
    given = given or {}
    out: dict[str, float | None] = {}
    for name, vals in values.items():
        stats = {"mean": mean(vals), **{f"p{p}": percentile(vals, p) for p in (50, 95, 99)}}
        for stat, computed in stats.items():
            key = f"{name}_{stat}_s"
            out[key] = given[key] if given.get(key) is not None else computed
        if name in max_of:
            out[f"{name}_max_s"] = max(vals, default=None)
    for name in ("e2e", "ttft", "tpot"):
        out[f"p99_p50_{name}_ratio"] = ratio(out[f"{name}_p99_s"], out[f"{name}_p50_s"])
    return out


def _count(ms: Sequence[RequestLatencies], reason: FinishReason) -> int:
    return sum(1 for m in ms if m.finish_reason is reason)


def _rejected_by_reason(ms: Sequence[RequestLatencies]) -> dict[str, int]:
    """{RejectReason value: count} of the requests admission refused, by name."""
    reasons = Counter(m.reject_reason or "unknown" for m in ms
                      if m.finish_reason is FinishReason.REJECTED)
    return dict(sorted(reasons.items()))


def _prefix_cache_fields(done: list[RequestLatencies]) -> dict[str, float | None]:
    """The hit rate and the repeated share over completed requests' prompts; the share
    only where every one of them was measured."""
    prompt = sum(m.num_prompt_tokens for m in done)
    repeated = [m.num_repeated_tokens for m in done]
    measured = all(n is not None for n in repeated)
    return {"prefix_cache_hit_rate": ratio(sum(m.num_cached_tokens for m in done), prompt),
            "prefix_repeated_share": ratio(sum(n or 0 for n in repeated), prompt)
            if measured else None}


def request_summary(ms: Sequence[RequestLatencies], duration_s: float, *,
                    long_request_threshold: int = LONG_REQUEST_THRESHOLD) -> RunSummary:
    """The request fields of a summary (no step fields), from measured requests."""
    if duration_s < 0:
        raise ValueError(f"duration_s = {duration_s!r}: must be >= 0")
    done = [m for m in ms if m.completed]
    output_tokens = sum(m.num_output_tokens for m in ms)
    long_ = [m for m in ms if m.num_output_tokens > long_request_threshold]
    preemptions = sum(m.num_preemptions for m in ms)
    return RunSummary.of(
        requests_total=len(ms),
        requests_finished=len(done),
        requests_rejected=_count(ms, FinishReason.REJECTED),
        rejected_by_reason=_rejected_by_reason(ms),
        requests_timed_out=_count(ms, FinishReason.TIMED_OUT),
        requests_aborted=_count(ms, FinishReason.ABORT),
        requests_failed=_count(ms, FinishReason.ERROR),
        requests_unfinished=sum(1 for m in ms if m.finish_reason is None),
        output_tokens=output_tokens,
        prompt_tokens=sum(m.num_prompt_tokens for m in ms if m.scheduled),
        duration_s=duration_s,
        throughput_tokens_per_s=ratio(output_tokens, duration_s),
        throughput_requests_per_s=ratio(len(done), duration_s),
        **latency_fields(_latency_values(done), max_of=("itl",)),
        preemptions=preemptions,
        preempted_requests=sum(1 for m in ms if m.num_preemptions > 0),
        long_request_threshold=long_request_threshold,
        long_requests=len(long_),
        long_request_share=ratio(len(long_), len(ms)),
        preemptions_on_long_share=ratio(sum(m.num_preemptions for m in long_), preemptions),
        swapped_blocks=sum(m.num_swapped_out_blocks for m in ms),
        recomputed_tokens=sum(m.num_recomputed_tokens for m in ms),
        **_prefix_cache_fields(done),
    )


def summarize_latencies(ms: Sequence[RequestLatencies], steps: Steps, duration_s: float, *,
                        long_request_threshold: int = LONG_REQUEST_THRESHOLD) -> RunSummary:
    """Summarise one run from its measured requests (any outcome) and its step records
    (one list, or one list per replica as in SimResult.steps)."""
    arrivals = [m.arrival_time for m in ms]
    window = (min(arrivals), max(arrivals)) if arrivals else None
    requests = request_summary(ms, duration_s, long_request_threshold=long_request_threshold)
    return requests.updated(step_summary(steps, window)).updated(alert_times(ms, steps))


def summarize(requests: Sequence[Request], steps: Steps, duration_s: float, *,
              long_request_threshold: int = LONG_REQUEST_THRESHOLD) -> RunSummary:
    """`summarize_latencies` of the requests, measured here."""
    return summarize_latencies(measure_requests(requests), steps, duration_s,
                               long_request_threshold=long_request_threshold)


def by_class(ms: Sequence[RequestLatencies], duration_s: float, *,
             long_request_threshold: int = LONG_REQUEST_THRESHOLD) -> dict[str, RunSummary]:
    """{request_class: request fields of that class's requests}, classes sorted by name
    (no step fields: a step serves every class at once); throughputs use the whole run's
    duration_s."""
    groups: dict[str, list[RequestLatencies]] = {}
    for m in ms:
        groups.setdefault(m.request_class, []).append(m)
    return {name: request_summary(groups[name], duration_s,
                                  long_request_threshold=long_request_threshold)
            for name in sorted(groups)}


def summarize_by_class(requests: Sequence[Request], steps: Steps, duration_s: float, *,
                       long_request_threshold: int = LONG_REQUEST_THRESHOLD
                       ) -> dict[str, RunSummary]:
    """`by_class` of the requests, measured here. `steps` is accepted so both summaries
    take the same arguments; step fields are run-wide (see `by_class`)."""
    del steps
    return by_class(measure_requests(requests), duration_s,
                    long_request_threshold=long_request_threshold)


# ---- everything measured of one run, each measured once ----

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
        return asdict(self)

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
    ts = timeseries(steps, bins=bins, count_steps=True)
    return replace(ts, t=[t - t0 for t in ts.t])


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
