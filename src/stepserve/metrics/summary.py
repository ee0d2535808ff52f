"""One run, summarised as a plain JSON-able dict: the numbers the seed says matter.

Request keys (from the requests; latencies from completed ones only, see
request_metrics.py):
  requests_total, requests_finished (stop or length), requests_rejected,
  requests_timed_out, requests_aborted, requests_failed (a fault in their step),
  requests_unfinished (still live);
  output_tokens (every generated token, any outcome), prompt_tokens (prompts of requests
  that ran at least once), duration_s, throughput_tokens_per_s (output_tokens /
  duration_s), throughput_requests_per_s (requests_finished / duration_s);
  {ttft,tpot,itl,e2e,queue_time}_{mean,p50,p95,p99}_s (ITL pools every gap of every
  completed request); p99_p50_{e2e,ttft,tpot}_ratio;
  preemptions (sum of num_preemptions), preempted_requests, long_request_threshold,
  long_requests and long_request_share (output over the threshold),
  preemptions_on_long_share (share of preemptions that hit long requests; None without
  preemptions), swapped_blocks, recomputed_tokens.

Step keys (step_metrics.py):
  replicas, steps, mean_step_s, decode_step_p50_s (median duration of steps with decode
  tokens), slot_utilization (sum num_active / sum slots_held), active_ratio_p50/_mean
  (per step num_active / slots_held), prefill_step_share (prefill tokens, no decode
  tokens), zero_decode_step_share (decode-ready sequences, no decode tokens),
  prefill_token_share, prefill_tokens_computed, decode_tokens_computed (recompute
  included), waiting_max/_p50/_mean, waiting_nonzero_share (share of samples with a
  queue), waiting_growth (least-squares slope of the waiting queue, requests/s, fitted
  between the first and last arrival), waiting_trend_rise (that slope times that window:
  how many requests the fitted line climbs), waiting_monotonic_rise_s and
  waiting_monotonic_rise (longest stretch, in seconds, in which the queue never
  shrank and grew, and by how much), running_max/_mean, in_engine_max (running +
  waiting + swapped), kv_usage_max/_mean.

A key is None where it is undefined (no completed request, no steps, no preemption).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepserve.metrics.percentiles import mean, percentile, ratio
from stepserve.metrics.request_metrics import UNCLASSIFIED, RequestLatencies, request_metrics
from stepserve.metrics.step_metrics import Steps, TimeSeries, step_summary, timeseries
from stepserve.request import FinishReason, Request

__all__ = ["LATENCIES", "request_summary", "summarize", "summarize_by_class", "timeseries",
           "TimeSeries"]

LATENCIES = ("ttft", "tpot", "itl", "e2e", "queue_time")
LONG_REQUEST_THRESHOLD = 1200  # output tokens; the seed's "输出超过 1,200 token 的请求"


def _latency_values(done: list[RequestLatencies]) -> dict[str, list[float]]:
    return {
        "ttft": [m.ttft_s for m in done if m.ttft_s is not None],
        "tpot": [m.tpot_s for m in done if m.tpot_s is not None],
        "itl": [gap for m in done for gap in m.itl_s],
        "e2e": [m.e2e_s for m in done if m.e2e_s is not None],
        "queue_time": [m.queue_time_s for m in done if m.queue_time_s is not None],
    }


def _count(ms: list[RequestLatencies], reason: FinishReason) -> int:
    return sum(1 for m in ms if m.finish_reason is reason)


def request_summary(requests: Sequence[Request], duration_s: float, *,
                    long_request_threshold: int = LONG_REQUEST_THRESHOLD) -> dict[str, Any]:
    """The request keys of `summarize` (no step keys)."""
    if duration_s < 0:
        raise ValueError(f"duration_s = {duration_s!r}: must be >= 0")
    ms = [request_metrics(r) for r in requests]
    done = [m for m in ms if m.completed]
    out: dict[str, Any] = {
        "requests_total": len(ms),
        "requests_finished": len(done),
        "requests_rejected": _count(ms, FinishReason.REJECTED),
        "requests_timed_out": _count(ms, FinishReason.TIMED_OUT),
        "requests_aborted": _count(ms, FinishReason.ABORT),
        "requests_failed": _count(ms, FinishReason.ERROR),
        "requests_unfinished": sum(1 for m in ms if m.finish_reason is None),
        "output_tokens": sum(m.num_output_tokens for m in ms),
        "prompt_tokens": sum(m.num_prompt_tokens for m in ms if m.scheduled),
        "duration_s": duration_s,
    }
    out["throughput_tokens_per_s"] = ratio(out["output_tokens"], duration_s)
    out["throughput_requests_per_s"] = ratio(len(done), duration_s)

    for name, values in _latency_values(done).items():
        out[f"{name}_mean_s"] = mean(values)
        for p in (50, 95, 99):
            out[f"{name}_p{p}_s"] = percentile(values, p)
    for name in ("e2e", "ttft", "tpot"):
        out[f"p99_p50_{name}_ratio"] = ratio(out[f"{name}_p99_s"], out[f"{name}_p50_s"])

    long_ = [m for m in ms if m.num_output_tokens > long_request_threshold]
    preemptions = sum(m.num_preemptions for m in ms)
    out.update({
        "preemptions": preemptions,
        "preempted_requests": sum(1 for m in ms if m.num_preemptions > 0),
        "long_request_threshold": long_request_threshold,
        "long_requests": len(long_),
        "long_request_share": ratio(len(long_), len(ms)),
        "preemptions_on_long_share": ratio(sum(m.num_preemptions for m in long_),
                                           preemptions),
        "swapped_blocks": sum(m.num_swapped_out_blocks for m in ms),
        "recomputed_tokens": sum(m.num_recomputed_tokens for m in ms),
    })
    return out


def summarize(requests: Sequence[Request], steps: Steps, duration_s: float, *,
              long_request_threshold: int = LONG_REQUEST_THRESHOLD) -> dict[str, Any]:
    """Summarise one run: every request (any outcome) and the step records (one list,
    or one list per replica as in SimResult.steps). Keys: see the module docstring."""
    out = request_summary(requests, duration_s, long_request_threshold=long_request_threshold)
    arrivals = [r.arrival_time for r in requests]
    window = (min(arrivals), max(arrivals)) if arrivals else None
    out.update(step_summary(steps, window))
    return out


def summarize_by_class(requests: Sequence[Request], steps: Steps, duration_s: float, *,
                       long_request_threshold: int = LONG_REQUEST_THRESHOLD
                       ) -> dict[str, dict[str, Any]]:
    """{request_class: request keys of that class's requests}, classes sorted by name;
    requests without a class go under "unclassified".

    Step keys are omitted: a step serves every class at once, so its metrics (slot
    utilisation, shares, queues, KV) belong to the run, not to a class; read them from
    `summarize`. `steps` is accepted so both calls take the same arguments.
    Throughputs use the whole run's duration_s.
    """
    del steps  # documented above: step keys are run-wide
    groups: dict[str, list[Request]] = {}
    for r in requests:
        groups.setdefault(r.request_class or UNCLASSIFIED, []).append(r)
    return {name: request_summary(groups[name], duration_s,
                                  long_request_threshold=long_request_threshold)
            for name in sorted(groups)}
