"""Per-request latency metrics, with vLLM's definitions: TTFT = first token - arrival,
E2E = last token (else the finish) - arrival, TPOT = (E2E - TTFT) / (output tokens - 1)
for 2+ tokens, ITL = every gap between tokens, queue = first scheduled - arrival. Only
completed requests (stop or length) feed the latency percentiles.

The prefix cache: `num_cached_tokens` came from the cache at first admission;
`num_repeated_tokens` an earlier prompt already held (what a cache that never evicted
could give; None where not measured). Their gap is what evictions cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stepserve.core.end_reasons import FinishReason
from stepserve.core.prefix_hash import BlockHash, namer
from stepserve.core.request import Request

UNCLASSIFIED = "unclassified"  # class name for requests without a request_class
# The grain a repeated prefix is counted in: the engine's default KV block, since a cache
# shares whole blocks only. A run with larger blocks can hit a little less than this says.
REPEAT_BLOCK_TOKENS = 16


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
    num_cached_tokens: int = 0
    num_repeated_tokens: int | None = None  # None: not measured

    @property
    def completed(self) -> bool:
        return self.finish_reason is not None and self.finish_reason.completed


def stream_latencies(start: float, times: Sequence[float], end: float | None,
                     num_output_tokens: int) -> tuple[float | None, float | None, float | None]:
    """(TTFT, E2E, TPOT) of a stream begun at `start`, its tokens at `times`, ended at
    `end`, by the definitions above: a request on the engine's clock and a bench
    client's record on its own are measured alike."""
    ttft = times[0] - start if times else None
    last = times[-1] if times else end
    e2e = None if last is None else last - start
    if num_output_tokens < 2 or ttft is None or e2e is None:
        return ttft, e2e, None
    return ttft, e2e, (e2e - ttft) / (num_output_tokens - 1)


def request_metrics(req: Request, repeated_tokens: int | None = None) -> RequestLatencies:
    """Measure one request from its timestamps (`repeated_tokens`: see
    `measure_requests`)."""
    times = req.token_times
    arrival = req.arrival_time
    n_out = len(req.output_token_ids)
    ttft, e2e, tpot = stream_latencies(arrival, times, req.finish_time, n_out)
    itl = tuple(b - a for a, b in zip(times, times[1:], strict=False))
    first = req.first_scheduled_time
    queue = None if first is None else first - arrival
    return RequestLatencies(
        request_id=req.request_id, request_class=req.request_class or UNCLASSIFIED,
        arrival_time=arrival,
        finish_reason=req.finish_reason,
        reject_reason=req.reject_reason.value if req.reject_reason is not None else None,
        num_prompt_tokens=req.num_prompt_tokens,
        num_output_tokens=n_out, scheduled=first is not None,
        ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, queue_time_s=queue, itl_s=itl,
        num_preemptions=req.num_preemptions, num_swapped_out_blocks=req.num_swapped_out_blocks,
        num_recomputed_tokens=req.num_recomputed_tokens,
        num_cached_tokens=req.num_cached_tokens, num_repeated_tokens=repeated_tokens)


def measure_requests(requests: Sequence[Request]) -> list[RequestLatencies]:
    """Every request measured, with the prompt tokens each repeats of an earlier one."""
    repeated = repeated_prefix_tokens(requests)
    return [request_metrics(r, n) for r, n in zip(requests, repeated, strict=True)]


def cacheable_tokens(shared_tokens: int, prompt_len: int,
                     block_size: int = REPEAT_BLOCK_TOKENS) -> int:
    """Of `shared_tokens` leading tokens a prompt shares with an earlier one, those a
    cache can give: whole blocks, and never the prompt's last token (the engine computes
    it for its logits, as core/kv_cache.py's cached_prefix)."""
    usable = min(shared_tokens, prompt_len - 1)
    return max(usable, 0) // block_size * block_size


def repeated_prefix_tokens(requests: Sequence[Request],
                           block_size: int = REPEAT_BLOCK_TOKENS) -> list[int]:
    """For each request, the leading prompt tokens (whole blocks, at most all but its
    last) that a request arriving before it began with, under the same cache salt, blocks
    named as the prefix cache names them. A prompt's blocks are named only once another
    begins with the same first block: distinct prompts cost one hash each."""
    first_seen: dict[BlockHash, Request] = {}  # a first block -> the prompt that had it
    named: set[BlockHash] = set()  # every block of every prompt whose first one recurred
    expanded: set[int] = set()  # ids of the prompts whose blocks are in `named`
    out = [0] * len(requests)
    for i in sorted(range(len(requests)), key=lambda i: requests[i].arrival_time):
        req = requests[i]
        ids = req.prompt_token_ids
        if len(ids) <= block_size:
            continue  # no full block below its last token
        first = namer().prompt_names(ids, req.cache_salt, block_size, 1)[0]
        earlier = first_seen.setdefault(first, req)
        if earlier is req:
            continue
        if id(earlier) not in expanded:
            named.update(_chain(earlier, block_size))
            expanded.add(id(earlier))
        chain = _chain(req, block_size)
        limit = (len(ids) - 1) // block_size
        out[i] = next((k for k, h in enumerate(chain[:limit]) if h not in named),
                      limit) * block_size
        named.update(chain)
        expanded.add(id(req))
    return out


def _chain(req: Request, block_size: int) -> list[BlockHash]:
    """The names of the full blocks of `req`'s prompt."""
    return namer().prompt_names(req.prompt_token_ids, req.cache_salt, block_size)
