"""A sweep point measured in its steady state, not over its whole run (docs/guide.md).

At high load a run's drain (everything has arrived; the last long requests run nearly
alone) can be most of it, so whole-run throughput would level a saturated config far
below what it sustains. As GuideLLM and `vllm bench serve` do, a point is measured over
[first arrival + warm-up, last arrival]: tokens produced inside the window, latencies of
the requests that arrived inside it (followed to their end), steps started inside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from stepserve.bench.results import from_fields
from stepserve.metrics.percentiles import percentile, ratio
from stepserve.metrics.request_metrics import RequestLatencies, measure_requests
from stepserve.metrics.step_metrics import step_summary
from stepserve.metrics.summary import by_class, latency_samples, request_summary
from stepserve.sim.loop import SimResult
from stepserve.sim.run import RunResult, config_facts

WARMUP_SHARE = 0.10
MIN_WINDOW_REQUESTS = 20
SETTLED_LIFETIMES = 2.0
WINDOWS = ("steady", "whole")


@dataclass(frozen=True)
class WindowRule:
    """How each point is measured: `kind` "steady" (a window, see the module doc) or
    "whole" (the whole run, warm-up and drain included)."""

    kind: str = "steady"
    warmup_share: float = WARMUP_SHARE

    def __post_init__(self) -> None:
        if self.kind not in WINDOWS:
            raise ValueError(f"--window {self.kind!r}: allowed: {', '.join(WINDOWS)}")
        if not 0 <= self.warmup_share < 1:
            raise ValueError(f"--warmup-share {self.warmup_share:g}: must be in [0, 1)")

    def describe(self) -> str:
        if self.kind == "whole":
            return "each point's whole run (warm-up and drain included)"
        return (f"each point's steady window: from its first arrival + a warm-up ("
                f"{self.warmup_share:.0%} of the arrival span, or one request lifetime if "
                "longer) to its last arrival (warm-up and drain left out); tokens "
                "produced inside it, latencies of the requests that arrived inside it")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> WindowRule | None:
        """None for a result written before windows: its points measured whole runs."""
        return from_fields(cls, data) if data else None


STEADY = WindowRule()


@dataclass(frozen=True)
class Window:
    """The span one point was measured over. `steady` False: the whole run, `note` why."""

    start_s: float
    end_s: float
    requests: int  # arrivals inside the window
    steady: bool
    note: str = ""
    whole_run_tokens_per_s: float | None = None  # for comparison with the window's
    lifetime_s: float | None = None  # median time in the engine of its requests

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def settled(self) -> bool:
        """Long enough for the batch to have reached its level (see the module doc)."""
        return not self.steady or self.lifetime_s is None or \
            self.length_s >= SETTLED_LIFETIMES * self.lifetime_s

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "settled": self.settled}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Window | None:
        return from_fields(cls, data) if data else None


def steady_window(arrivals: Sequence[float], rule: WindowRule,
                  lifetime_s: float | None = None) -> Window:
    """The window over arrival times `arrivals` (any order) for requests that live
    `lifetime_s` in the engine, or the whole run's span. The warm-up is `warmup_share` of
    the arrival span, or one lifetime if longer (a batch fills in about that time)."""
    if not arrivals:
        return Window(0.0, 0.0, 0, False, "no requests")
    first, last = min(arrivals), max(arrivals)
    whole = Window(first, last, len(arrivals), False, lifetime_s=lifetime_s)
    if rule.kind == "whole":
        return replace(whole, note="--window whole")
    if last <= first:
        return replace(whole, note="every request arrived at once: no steady state")
    start = first + max(rule.warmup_share * (last - first), lifetime_s or 0.0)
    inside = sum(1 for t in arrivals if start <= t <= last)
    if inside < MIN_WINDOW_REQUESTS:
        return replace(whole, note=f"only {inside} arrivals in the steady window (fewer "
                                   f"than {MIN_WINDOW_REQUESTS}): whole run")
    return Window(start, last, inside, True, lifetime_s=lifetime_s)


def lifetime(ms: Sequence[RequestLatencies]) -> float | None:
    """The median time completed requests spent in the engine (E2E less queueing)."""
    return percentile([m.e2e_s - m.queue_time_s for m in ms if m.completed
                       and m.e2e_s is not None and m.queue_time_s is not None], 50)


def tokens_between(token_times: Sequence[Sequence[float]], start: float, end: float) -> int:
    """Output tokens produced in [start, end], over every request."""
    return sum(1 for times in token_times for t in times if start <= t <= end)


def windowed_run(run: RunResult, sim: SimResult, rule: WindowRule) -> tuple[RunResult, Window]:
    """`run` (the whole simulation measured) with its summary, classes and latency
    samples measured over the steady window instead, and the window."""
    every = measure_requests(sim.requests)  # repeats of prompts before the window count
    window = steady_window([m.arrival_time for m in every], rule, lifetime(every))
    window = replace(window, whole_run_tokens_per_s=run.summary.throughput_tokens_per_s)
    if not window.steady:
        return run, window
    start, end = window.start_s, window.end_s
    length = end - start
    ms = [m for m in every if start <= m.arrival_time <= end]
    tokens = tokens_between([r.token_times for r in sim.requests], start, end)
    finished = sum(1 for r in sim.requests if r.finish_reason is not None
                   and r.finish_reason.completed and r.finish_time is not None
                   and start <= r.finish_time <= end)
    steps = [[s for s in replica if start <= s.start_s <= end] for replica in sim.steps]
    summary = (request_summary(ms, length)
               .updated(step_summary(steps, (start, end)))
               .with_values(output_tokens=tokens, duration_s=length,
                            throughput_tokens_per_s=ratio(tokens, length),
                            throughput_requests_per_s=ratio(finished, length)))
    if run.config is not None:
        summary = summary.with_values(**config_facts(run.config))
    classes = by_class(ms, length) if run.by_class is not None else None
    return replace(run, summary=summary, by_class=classes,
                   latency_samples=latency_samples(ms)), window
