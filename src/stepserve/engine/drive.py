"""Keeping N requests in flight on the real engine, the way the night-report batch job
drives a server: the next one is sent the moment one ends."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stepserve.core.output import StepRecord
from stepserve.core.request import Request, SamplingParams
from stepserve.engine.llm_engine import EngineStep, LLMEngine


@dataclass
class ClosedLoopResult:
    requests: list[Request]  # every request, in issue order
    steps: list[StepRecord]  # every step that ran
    duration_s: float


def run_closed_loop(engine: LLMEngine, jobs: Sequence[tuple[list[int], SamplingParams]],
                    concurrency: int, request_class: Callable[[int], str] | None = None
                    ) -> ClosedLoopResult:
    """Run every (prompt ids, params) job with `concurrency` in flight; returns every
    request (in issue order) and the wall time from the first issue to the last end."""
    start = engine.clock.now()
    issued: list[Request] = []
    steps: list[StepRecord] = []

    def issue_one() -> None:
        """Send the next job; one refused at admission ends at once: send another."""
        while len(issued) < len(jobs):
            k = len(issued)
            ids, params = jobs[k]
            req = engine.add_request(ids, params, request_id=f"job-{k}")
            if request_class is not None:
                req.request_class = request_class(k)
            issued.append(req)
            if not req.is_finished:
                return

    def on_step(result: EngineStep) -> None:
        if result.ran:
            steps.append(result.record)
        for _ in result.finished:
            issue_one()

    for _ in range(min(concurrency, len(jobs))):
        issue_one()
    engine.run_until_done(on_step)
    return ClosedLoopResult(issued, steps, engine.clock.now() - start)
