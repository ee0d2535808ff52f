"""Offline drivers of the real engine, each a thin loop over `LLMEngine.step()` and its
StepResult: run what was added to completion, or keep N requests in flight the way the
night-report batch job drives a server (the next one is sent the moment one ends)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stepserve.core.output import StepRecord
from stepserve.core.request import Request, SamplingParams
from stepserve.engine.llm_engine import EngineStep, LLMEngine
from stepserve.engine.seam import StreamOutput


def run_to_completion(engine: LLMEngine, on_step: Callable[[EngineStep], None] | None = None
                      ) -> dict[str, StreamOutput]:
    """Step until nothing is left; `on_step` sees every result. Returns every sequence's
    final output, by its request id."""
    finals: dict[str, StreamOutput] = {}
    while engine.has_unfinished():
        result = engine.step()
        finals.update((req.request_id, out) for req, out in result.outputs if out.finished)
        if on_step is not None:
            on_step(result)
    return finals


@dataclass
class ClosedLoopResult:
    requests: list[Request]  # every request, in issue order
    steps: list[StepRecord]  # every step that ran
    duration_s: float


def run_closed_loop(engine: LLMEngine, jobs: Sequence[tuple[list[int], SamplingParams]],
                    concurrency: int, request_class: Callable[[int], str] | None = None,
                    progress: Callable[[int], None] | None = None) -> ClosedLoopResult:
    """Run every (prompt ids, params) job with `concurrency` in flight; returns every
    request (in issue order) and the wall time from the first issue to the last end.
    `progress(n)`: n more requests ended."""
    clock = engine.clock
    start = clock.now()
    issued: list[Request] = []

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
            if progress is not None:
                progress(1)

    for _ in range(min(concurrency, len(jobs))):
        issue_one()
    steps: list[StepRecord] = []
    while engine.has_unfinished():
        result = engine.step()
        if result.ran:
            steps.append(result.record)
        ended = result.finished
        if ended and progress is not None:
            progress(len(ended))
        for _ in ended:
            issue_one()
    return ClosedLoopResult(issued, steps, clock.now() - start)
