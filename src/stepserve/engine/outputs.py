"""What the engine hands back, in vLLM's shape: RequestOutput.outputs[0].text."""

from __future__ import annotations

from dataclasses import dataclass, field

from stepserve.request import Request


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # stop, length, abort, rejected, timed_out
    stop_reason: str | int | None = None  # the stop string or token that ended it


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    num_preemptions: int

    @classmethod
    def of(cls, r: Request) -> RequestMetrics:
        return cls(r.arrival_time, r.first_scheduled_time,
                   r.token_times[0] if r.token_times else None, r.finish_time,
                   r.num_preemptions)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    metrics: RequestMetrics | None = None
    message: str = ""  # why it ended, when it did not end normally
