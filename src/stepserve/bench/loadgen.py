"""Issue a workload's requests against an HTTP target: open loop (each request sent at
its arrival time, however many are in flight) or closed loop (N in flight, the next sent
the moment one ends).

Records are created up front and filled in place, so whatever happened before an
interrupt (Ctrl-C) is still there to summarise: requests cut off are marked
`interrupted`, those never sent `not_sent`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from stepserve.bench.client import RequestRecord, completion_body, stream_completion
from stepserve.workload.spec import RequestSpec


def token_prompt(spec: RequestSpec, vocab: int = 500) -> list[int]:
    """A deterministic prompt of exactly spec.prompt_len token ids in [10, vocab)."""
    span = max(vocab - 10, 1)
    return [10 + (spec.index * 31 + k * 7) % span for k in range(spec.prompt_len)]


def text_prompt(spec: RequestSpec) -> str:
    """About spec.prompt_len tokens of text (one short word per token on most tokenizers)."""
    words = ("the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far")
    return " ".join(words[(spec.index + k) % len(words)] for k in range(spec.prompt_len))


@dataclass
class LoadPlan:
    specs: Sequence[RequestSpec]
    concurrency: int | None = None  # closed loop when set
    warmup: int = 0  # the first `warmup` requests are excluded from metrics
    duration_s: float | None = None  # stop issuing after this (warm-up not counted)
    text_prompts: bool = False
    ignore_eos: bool = True


@dataclass
class HttpTarget:
    base_url: str
    model: str
    timeout_s: float = 600.0
    records: list[RequestRecord] = field(default_factory=list)

    @property
    def completions_url(self) -> str:
        return self.base_url.rstrip("/") + "/v1/completions"


def make_records(plan: LoadPlan) -> list[RequestRecord]:
    return [RequestRecord(index=s.index, request_class=s.request_class,
                          prompt_len=s.prompt_len, max_tokens=s.max_tokens,
                          warmup=i < plan.warmup, scheduled_s=s.arrival_s)
            for i, s in enumerate(plan.specs)]


async def run_http(target: HttpTarget, plan: LoadPlan, records: list[RequestRecord],
                   client: httpx.AsyncClient,
                   on_done: Callable[[RequestRecord], None] | None = None) -> None:
    """Send every request of `plan`, filling `records` (from make_records) in place."""
    t0 = time.perf_counter()
    measure_start: list[float] = []

    async def one(i: int) -> None:
        spec, record = plan.specs[i], records[i]
        prompt = text_prompt(spec) if plan.text_prompts else token_prompt(spec)
        body = completion_body(target.model, prompt, spec.max_tokens, plan.ignore_eos)
        try:
            await stream_completion(client, target.completions_url, body, record, t0)
        except asyncio.CancelledError:
            record.error = "interrupted before the response ended"
            record.end_s = time.perf_counter() - t0
            raise
        if on_done is not None:
            on_done(record)

    def out_of_time(i: int) -> bool:
        if plan.duration_s is None or i < plan.warmup:
            return False
        if not measure_start:
            measure_start.append(time.perf_counter())
        return time.perf_counter() - measure_start[0] > plan.duration_s

    tasks: list[asyncio.Task] = []
    try:
        if plan.concurrency is None:
            for i, spec in enumerate(plan.specs):
                delay = spec.arrival_s - (time.perf_counter() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
                if out_of_time(i):
                    break
                tasks.append(asyncio.create_task(one(i)))
            if tasks:
                await asyncio.gather(*tasks)
        else:
            queue = iter(range(len(plan.specs)))

            async def worker() -> None:
                for i in queue:
                    if out_of_time(i):
                        return
                    await one(i)

            tasks = [asyncio.create_task(worker()) for _ in range(plan.concurrency)]
            await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
