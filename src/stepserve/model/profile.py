"""Measure `TorchRunner` step times on synthetic batches: decode-only steps at a given
batch size and context, optionally with a prefill chunk riding along. These are the
numbers a calibrated cost model fits and the benchmarks print.

The requests are throwaway: blocks are allocated in the runner's own KV manager and
freed afterwards; the KV contents are whatever the warm-up wrote (timing does not
depend on values).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from stepserve.core.output import SchedulerOutput
from stepserve.model.runner import TorchRunner
from stepserve.request import Request, SamplingParams


@dataclass(frozen=True)
class StepTiming:
    batch_size: int  # decode sequences
    context_len: int  # tokens each decode sequence attends to (its KV length)
    prefill_tokens: int  # one extra sequence's chunk in the same step (0: none)
    median_s: float
    min_s: float
    repeats: int


def _requests(n: int, length: int, prefix: str) -> list[Request]:
    params = SamplingParams(max_tokens=1 << 20, temperature=0.0, ignore_eos=True)
    return [Request(f"{prefix}{i}", [(7 * i + j) % 500 + 3 for j in range(length)], params, 0.0)
            for i in range(n)]


def measure_step(runner: TorchRunner, batch_size: int, context_len: int,
                 prefill_tokens: int = 0, repeats: int = 10, warmup: int = 2) -> StepTiming:
    """Time one step of `batch_size` decodes at `context_len` (plus an optional prefill
    chunk). The decodes re-run the same position each repeat, so context stays fixed."""
    mgr = runner.kv_cache_manager
    decodes = _requests(batch_size, context_len, "profile-d")
    prefill = _requests(1 if prefill_tokens else 0, prefill_tokens, "profile-p")
    reqs = decodes + prefill
    try:
        for r in reqs:
            if not mgr.allocate_slots(r, r.num_prompt_tokens):
                raise ValueError(f"KV cache too small for {len(reqs)} x "
                                 f"{r.num_prompt_tokens} tokens")
        for r in decodes:  # KV of the first context_len - 1 tokens is "already computed"
            r.num_computed_tokens = context_len - 1
        counts = [1] * batch_size + [prefill_tokens] * len(prefill)
        times = []
        for i in range(warmup + repeats):
            out = runner.execute(SchedulerOutput(i, reqs, counts))
            if i >= warmup:
                times.append(out.elapsed_s)
    finally:
        for r in reqs:
            mgr.free(r)
    return StepTiming(batch_size, context_len, prefill_tokens, statistics.median(times),
                      min(times), repeats)
