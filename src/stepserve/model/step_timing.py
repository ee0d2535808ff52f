"""Measure `TorchRunner` step times on synthetic batches: decode-only steps at a given
batch size and context, optionally with a prefill chunk riding along. These are the
numbers a calibrated cost model fits and the benchmarks print.

The requests are throwaway: blocks come from a KV block manager of their own over the
runner's KV store (the runner only reads block ids); the KV contents are whatever the
warm-up wrote (timing does not depend on values).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from stepserve.core.kv_cache import KVCacheManager
from stepserve.core.output import SchedulerOutput
from stepserve.core.request import Request, SamplingParams
from stepserve.model.runner import TorchRunner


@dataclass(frozen=True)
class StepTiming:
    batch_size: int  # decode sequences
    context_len: int  # tokens each decode sequence attends to (its KV length)
    prefill_tokens: int  # one extra sequence's chunk in the same step (0: none)
    median_s: float
    min_s: float
    repeats: int
    prefill_start: int = 0  # tokens of that sequence already in the KV cache
    times_s: tuple[float, ...] = ()  # every timed repeat


def _requests(n: int, length: int, prefix: str, decoding: bool = False) -> list[Request]:
    """`n` throwaway requests of `length` tokens; decoding ones hold their last token as
    an output token (what makes `Request.is_decoding` true once the rest is computed)."""
    params = SamplingParams(max_tokens=1 << 20, temperature=0.0, ignore_eos=True)
    reqs = []
    for i in range(n):
        ids = [(7 * i + j) % 500 + 3 for j in range(length)]
        req = Request(f"{prefix}{i}", ids[:-1] if decoding else ids, params, 0.0)
        if decoding:
            req.output_token_ids.append(ids[-1])
        reqs.append(req)
    return reqs


def measure_step(runner: TorchRunner, batch_size: int, context_len: int,
                 prefill_tokens: int = 0, repeats: int = 10, warmup: int = 2,
                 prefill_start: int = 0) -> StepTiming:
    """Time one step of `batch_size` decodes at `context_len` (plus an optional prefill
    chunk of `prefill_tokens` after `prefill_start` cached ones). Every repeat re-runs
    the same positions, so the shape stays fixed."""
    mgr = KVCacheManager(runner.num_gpu_blocks, runner.block_size)
    decodes = _requests(batch_size, context_len, "profile-d", decoding=True)
    prefill = _requests(1 if prefill_tokens else 0, prefill_start + prefill_tokens,
                        "profile-p")
    reqs = decodes + prefill
    for r in reqs:
        if not mgr.allocate_slots(r, r.num_tokens):
            raise ValueError(f"KV cache too small for {len(reqs)} x {r.num_tokens} tokens")
    for r in decodes:  # KV of the first context_len - 1 tokens is "already computed"
        r.num_computed_tokens = context_len - 1
    for r in prefill:
        r.num_computed_tokens = prefill_start
    counts = [1] * batch_size + [prefill_tokens] * len(prefill)
    tables = [mgr.block_table(r.request_id) for r in reqs]
    times = []
    for i in range(warmup + repeats):
        out = runner.execute(SchedulerOutput(i, reqs, counts, block_tables=tables))
        if i >= warmup:
            times.append(out.elapsed_s)
    return StepTiming(batch_size, context_len, prefill_tokens, statistics.median(times),
                      min(times), repeats, prefill_start, tuple(times))
