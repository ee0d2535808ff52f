"""Issue a workload's requests against an HTTP target, as `vllm bench serve` does: each
request is due at its arrival time (all at once for rate inf), and with a concurrency
cap it then waits for one of the cap's slots; its send time (TTFT's start) is when it
goes out. Rate inf with a cap is a closed loop: N in flight, the next sent the moment
one ends.

A multi-turn session (workload/sessions.py) is one task: its first turn is due at its
arrival, each later turn `think_time_s` after the answer before it arrived, its prompt
the conversation so far (prompt_maker.py's Conversation) and a new user message; a turn not
answered in full ends the session (the rest stay `not_sent`). Later turns wait for no
arrival, and a capped run counts sessions in flight: a user keeps their slot while
thinking, as the simulator's closed loop counts sessions.

Records are created up front and filled in place, so whatever happened before an
interrupt (Ctrl-C) is still there to summarise: requests cut off are marked
`interrupted`, those never sent `not_sent`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

from stepserve.bench.client import RequestRecord, stream_completion
from stepserve.bench.prefix_cache import repeated_tokens
from stepserve.bench.prompt_maker import Conversation, PromptMaker
from stepserve.bench.request_shape import RequestShape
from stepserve.config.errors import UsageError
from stepserve.workload.sessions import next_turns, session_starts
from stepserve.workload.spec import RequestSpec

T = TypeVar("T")


@dataclass
class LoadPlan:
    specs: Sequence[RequestSpec]
    concurrency: int | None = None  # at most this many in flight (None: no cap)
    warmup: int = 0  # the first `warmup` requests are excluded from metrics
    duration_s: float | None = None  # stop issuing after this (warm-up not counted)
    prompts: PromptMaker = field(default_factory=PromptMaker)  # text
    ignore_eos: bool = True
    shape: RequestShape = field(default_factory=RequestShape)


@dataclass
class HttpTarget:
    base_url: str
    model: str
    timeout_s: float = 600.0
    records: list[RequestRecord] = field(default_factory=list)
    endpoint: str = "/v1/completions"

    @property
    def completions_url(self) -> str:
        return self.base_url.rstrip("/") + self.endpoint


@dataclass
class SendWindow:
    """Whether a plan's request may still be sent: warm-up requests always go; the rest
    only until the plan's duration, timed on `clock` from the first measured one, has
    passed."""

    plan: LoadPlan
    clock: Callable[[], float]
    start: float | None = None

    def allows(self, i: int) -> bool:
        if self.plan.duration_s is None or i < self.plan.warmup:
            return True
        if self.start is None:
            self.start = self.clock()
        return self.clock() - self.start <= self.plan.duration_s


def make_records(plan: LoadPlan) -> list[RequestRecord]:
    repeated = repeated_tokens(plan.specs)
    return [RequestRecord(index=s.index, request_class=s.request_class,
                          prompt_len=s.prompt_len, max_tokens=s.max_tokens,
                          warmup=i < plan.warmup, scheduled_s=s.arrival_s,
                          repeated_tokens=repeated[i])
            for i, s in enumerate(plan.specs)]


def interruptible(work: Callable[[], T]) -> T:
    """`work()`, blocking the event loop's thread, with Ctrl-C raising KeyboardInterrupt
    inside it. asyncio.run's own handler only cancels the main task, and a cancel lands
    at the task's next await: after the blocking work (a tokenizer's first load imports
    torch, seconds and more on a busy machine), which is start-up seeming to ignore
    Ctrl-C. A SIGINT this process ignores (a shell's background job) stays ignored."""
    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(handler) \
            or handler is signal.default_int_handler:
        return work()
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return work()
    finally:  # asyncio.run's handler back (it restores the default itself when done)
        signal.signal(signal.SIGINT, handler)


async def run_http(target: HttpTarget, plan: LoadPlan, records: list[RequestRecord],
                   client: httpx.AsyncClient,
                   on_done: Callable[[RequestRecord], None] | None = None) -> None:
    """Send every request of `plan`, filling `records` (from make_records) in place.
    Prompts are built before the clock starts, so building them delays no send."""
    next_turn = next_turns(plan.specs)
    if next_turn and plan.prompts.token_ids:
        raise UsageError("multi_turn sessions send the answers back as text: drop "
                         "--token-id-prompts")
    starts = session_starts(plan.specs) if next_turn else range(len(plan.specs))
    prompts = interruptible(lambda: [plan.prompts(spec) for spec in plan.specs])
    t0 = time.perf_counter()
    window = SendWindow(plan, time.perf_counter)
    slots = asyncio.Semaphore(plan.concurrency) if plan.concurrency else None

    async def send(i: int, body: dict) -> None:
        record = records[i]
        try:
            await stream_completion(client, target.completions_url, body, record, t0)
        except asyncio.CancelledError:
            record.error = "interrupted before the response ended"
            record.end_s = time.perf_counter() - t0
            raise

    async def one(i: int) -> None:
        spec, record = plan.specs[i], records[i]
        body = plan.shape.body(target.model, prompts[i], spec.max_tokens, plan.ignore_eos)
        async with slots or contextlib.nullcontext():
            if not window.allows(i):
                return  # never sent
            if i in next_turn:
                return await session(i)
            await send(i, body)
        if on_done is not None:
            on_done(record)

    async def session(i: int | None) -> None:
        talk = Conversation(plan.shape.chat)
        while i is not None:
            spec, record = plan.specs[i], records[i]
            prompt = prompts[i]
            await send(i, talk.body(plan.shape, target.model, prompt, spec.max_tokens,
                                    plan.ignore_eos))
            if on_done is not None:
                on_done(record)
            i = next_turn.get(i)
            if i is None or not record.ok:
                return
            assert isinstance(prompt, str)
            talk.answered(prompt, record.generated_text)
            await asyncio.sleep(plan.specs[i].think_time_s)
            records[i].scheduled_s = time.perf_counter() - t0

    tasks: list[asyncio.Task] = []
    try:
        for i in starts:
            delay = plan.specs[i].arrival_s - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            if slots is None and not window.allows(i):
                break
            tasks.append(asyncio.create_task(one(i)))
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
