"""Drive the real engine the way the seed's batch job drives a server: keep
`concurrency` requests in flight, sending the next the moment one ends."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stepserve.engine.llm_engine import LLMEngine
from stepserve.request import Request, SamplingParams


@dataclass
class ClosedLoopResult:
    requests: list[Request]
    duration_s: float


def run_closed_loop(engine: LLMEngine, jobs: Sequence[tuple[list[int], SamplingParams]],
                    concurrency: int, request_class: Callable[[int], str] | None = None,
                    progress: Callable[[int], None] | None = None) -> ClosedLoopResult:
    """Run every (prompt ids, params) job with `concurrency` in flight; returns every
    request (in issue order) and the wall time from the first issue to the last end."""
    clock = engine.clock
    start = clock.now()
    issued: list[Request] = []
    next_job = 0

    def issue() -> None:
        nonlocal next_job
        ids, params = jobs[next_job]
        req = engine.add_request(ids, params, request_id=f"job-{next_job}")
        if request_class is not None:
            req.request_class = request_class(next_job)
        issued.append(req)
        next_job += 1

    while next_job < min(concurrency, len(jobs)):
        issue()
    finished_seen = len(engine.scheduler.finished)
    while engine.has_unfinished():
        engine.step()
        ended = len(engine.scheduler.finished) - finished_seen
        finished_seen += ended
        if ended and progress is not None:
            progress(ended)
        for _ in range(ended):
            if next_job < len(jobs):
                issue()
    engine.release(issued)
    return ClosedLoopResult(issued, clock.now() - start)
