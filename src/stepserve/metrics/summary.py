"""One run, summarised as a RunSummary (run_summary.py): the numbers that matter for
serving (latency percentiles, outcomes, preemption, batch and queue levels).

The request fields come from each request's RequestLatencies (request_metrics.py;
latencies from completed requests only), the step fields from the step records
(step_metrics.py), and when each alert would first have fired from both
(alert_times.py). Measure the requests once and hand the latencies to every summary
that needs them (`summarize_latencies`, `by_class`): run_data.measure_run does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from stepserve.core.request import FinishReason, Request
from stepserve.metrics.alert_times import alert_times
from stepserve.metrics.percentiles import mean, percentile, ratio
from stepserve.metrics.request_metrics import RequestLatencies, measure_requests
from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.step_metrics import Steps, TimeSeries, step_summary, timeseries

__all__ = ["LATENCIES", "RunSummary", "TimeSeries", "by_class", "request_summary",
           "summarize", "summarize_by_class", "summarize_latencies", "timeseries"]

LATENCIES = ("ttft", "tpot", "itl", "e2e", "queue_time")
# output tokens; the promo-spike incident's long requests ("输出超过 1,200 token 的请求")
LONG_REQUEST_THRESHOLD = 1200


def _latency_values(done: list[RequestLatencies]) -> dict[str, list[float]]:
    return {
        "ttft": [m.ttft_s for m in done if m.ttft_s is not None],
        "tpot": [m.tpot_s for m in done if m.tpot_s is not None],
        "itl": [gap for m in done for gap in m.itl_s],
        "e2e": [m.e2e_s for m in done if m.e2e_s is not None],
        "queue_time": [m.queue_time_s for m in done if m.queue_time_s is not None],
    }


def _latency_fields(done: list[RequestLatencies]) -> dict[str, float | None]:
    """{ttft,tpot,itl,e2e,queue_time}_{mean,p50,p95,p99}_s, itl_max_s and the P99/P50
    ratios, in the summary's order."""
    out: dict[str, float | None] = {}
    for name, values in _latency_values(done).items():
        out[f"{name}_mean_s"] = mean(values)
        for p in (50, 95, 99):
            out[f"{name}_p{p}_s"] = percentile(values, p)
        if name == "itl":
            out["itl_max_s"] = max(values, default=None)
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
        **_latency_fields(done),
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
    """{request_class: request fields of that class's requests}, classes sorted by name;
    requests without a class go under "unclassified".

    Step fields are left out: a step serves every class at once, so its metrics (slot
    utilisation, shares, queues, KV) belong to the run, not to a class. Throughputs use
    the whole run's duration_s.
    """
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
