"""`TorchRunner` step times on synthetic batches (decodes at a batch size and context, maybe a
prefill chunk beside them), over throwaway blocks of the runner's KV store.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stepserve.core.kv_cache import KVCacheManager
from stepserve.core.output import SchedulerOutput
from stepserve.core.request import Request, SamplingParams

if TYPE_CHECKING:
    from stepserve.model.runner import TorchRunner


@dataclass(frozen=True)
class StepTiming:
    median_s: float
    min_s: float
    times_s: tuple[float, ...]  # every timed repeat


def synthetic_step(decodes: int, context: int, chunk: int = 0,
                   chunk_start: int = 0) -> SchedulerOutput:
    """A step of `decodes` throwaway requests each decoding its `context`-th token (the
    last one held as an output token, which makes `Request.is_decoding` true), plus one
    prefill chunk of `chunk` tokens after `chunk_start` computed ones; no block tables."""
    params = SamplingParams(max_tokens=1 << 20, temperature=0.0, ignore_eos=True)
    reqs = []
    for i in range(decodes):
        ids = [(7 * i + j) % 500 + 3 for j in range(context)]
        req = Request(f"profile-d{i}", ids[:-1], params, 0.0)
        req.output_token_ids.append(ids[-1])
        req.num_computed_tokens = context - 1
        reqs.append(req)
    if chunk:
        req = Request("profile-p0", [j % 500 + 3 for j in range(chunk_start + chunk)], params,
                      0.0)
        req.num_computed_tokens = chunk_start
        reqs.append(req)
    return SchedulerOutput(0, reqs, [1] * decodes + [chunk] * (1 if chunk else 0))


def measure_step(runner: TorchRunner, batch_size: int, context_len: int,
                 prefill_tokens: int = 0, repeats: int = 10, warmup: int = 2,
                 prefill_start: int = 0) -> StepTiming:
    """Time one step of `batch_size` decodes at `context_len` (plus an optional prefill
    chunk of `prefill_tokens` after `prefill_start` cached ones). Every repeat re-runs
    the same positions, so the shape stays fixed."""
    mgr = KVCacheManager(runner.num_gpu_blocks, runner.block_size)
    step = synthetic_step(batch_size, context_len, prefill_tokens, prefill_start)
    for r in step.requests:
        if not mgr.allocate_slots(r, r.num_tokens - r.num_computed_tokens):
            raise ValueError(f"KV cache too small for {len(step.requests)} x {r.num_tokens} "
                             "tokens")
    tables = [mgr.block_table(r.request_id) for r in step.requests]
    times = []
    for i in range(warmup + repeats):
        out = runner.execute(SchedulerOutput(i, step.requests, step.num_scheduled_tokens,
                                             block_tables=tables))
        if i >= warmup:
            times.append(out.elapsed_s)
    return StepTiming(statistics.median(times), min(times), tuple(times))
