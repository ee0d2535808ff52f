"""Per-request latency metrics, with vLLM's definitions.

    TTFT  = first token time - arrival
    E2E   = last token time - arrival (the finish time when no token came out)
    TPOT  = (E2E - TTFT) / (output tokens - 1), for 2+ output tokens
    ITL   = every gap between consecutive token times
    queue = first scheduled time - arrival

A request *completed* when it ended with reason stop or length. Only completed requests
feed the latency percentiles: a rejected or timed-out request has no latency to speak of,
and an aborted one stopped for the client's reasons, not the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepserve.core.request import FinishReason, Request

UNCLASSIFIED = "unclassified"  # class name for requests without a request_class


@dataclass(frozen=True, slots=True)
class RequestLatencies:
    """One request's outcome and latencies (seconds; None where undefined). Not to be
    confused with engine/outputs.RequestMetrics, the timestamps on a RequestOutput in
    vLLM's shape."""

    request_id: str
    request_class: str
    arrival_time: float
    finish_reason: FinishReason | None  # None: still live
    reject_reason: str | None  # a RejectReason value when admission refused it
    num_prompt_tokens: int
    num_output_tokens: int
    scheduled: bool  # ran at least once
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    queue_time_s: float | None
    itl_s: tuple[float, ...]
    num_preemptions: int
    num_swapped_out_blocks: int
    num_recomputed_tokens: int

    @property
    def completed(self) -> bool:
        return self.finish_reason is not None and self.finish_reason.completed


def request_metrics(req: Request) -> RequestLatencies:
    """Measure one request from its timestamps."""
    times = req.token_times
    arrival = req.arrival_time
    ttft = times[0] - arrival if times else None
    end = times[-1] if times else req.finish_time
    e2e = end - arrival if end is not None else None
    n_out = len(req.output_token_ids)
    tpot = None
    if n_out >= 2 and ttft is not None and e2e is not None:
        tpot = (e2e - ttft) / (n_out - 1)
    itl = tuple(b - a for a, b in zip(times, times[1:], strict=False))
    queue = None
    if req.first_scheduled_time is not None:
        queue = req.first_scheduled_time - arrival
    return RequestLatencies(
        request_id=req.request_id, request_class=req.request_class or UNCLASSIFIED,
        arrival_time=arrival,
        finish_reason=req.finish_reason,
        reject_reason=req.reject_reason.value if req.reject_reason is not None else None,
        num_prompt_tokens=req.num_prompt_tokens,
        num_output_tokens=n_out, scheduled=req.first_scheduled_time is not None,
        ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, queue_time_s=queue, itl_s=itl,
        num_preemptions=req.num_preemptions, num_swapped_out_blocks=req.num_swapped_out_blocks,
        num_recomputed_tokens=req.num_recomputed_tokens)
