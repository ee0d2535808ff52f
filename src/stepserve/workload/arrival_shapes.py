"""Two arrival shapes the incidents need beyond a steady rate:

* `JobRounds`: a batch job that sends the same requests every round, in the same order
  (the night-report job: 54 short and 10 long reports a round, 64 in flight). Its
  lengths are exact, not sampled, so it is a trace-like source (a `TraceReplay`: the
  workload has no classes) generated on demand: any count, no file.
* `RateSchedule`: Poisson arrivals whose rate follows a piecewise-linear curve over time
  (the promotion that lifts a daily rate to its peak at 20:00); constant after its last
  point.

YAML shapes (workload/loader.py reads them through `SHAPES`):

    {rounds: {concurrency: 64, groups: [{name: short, count: 54, prompt: 128, output: 20},
                                        {name: long, count: 10, prompt: 128, output: 2000}]}}
    {rate_schedule: {points: [[0, 13.0], [120, 13.0], [180, 16.33]]}}   # [seconds, req/s]
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from stepserve.config.limits import (
    MAX_CONCURRENCY,
    MAX_LEN,
    MAX_NUM_REQUESTS,
    MAX_RATE,
    MAX_SECONDS,
)
from stepserve.config.user_files import preview
from stepserve.workload.arrivals import ArrivalProcess, TraceReplay
from stepserve.workload.errors import WorkloadError, check_int, check_keys, check_range, check_str
from stepserve.workload.spec import RequestSpec

GROUP_KEYS = ("name", "count", "prompt", "output")
MAX_POINTS = 1_000


class _RoundSpecs(Sequence[RequestSpec]):
    """Request i of a job that repeats `groups` (name, count, prompt, output) forever, in
    order; as long as a workload may be, built only when read."""

    def __init__(self, groups: tuple[tuple[str, int, int, int], ...]) -> None:
        self.order = [(name, prompt, output) for name, count, prompt, output in groups
                      for _ in range(count)]

    def __len__(self) -> int:
        return MAX_NUM_REQUESTS

    @overload
    def __getitem__(self, i: int) -> RequestSpec: ...

    @overload
    def __getitem__(self, i: slice) -> list[RequestSpec]: ...

    def __getitem__(self, i: int | slice) -> RequestSpec | list[RequestSpec]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if not 0 <= i < len(self):
            raise IndexError(i)
        name, prompt, output = self.order[i % len(self.order)]
        return RequestSpec(i, 0.0, prompt, output, output, request_class=name)


@dataclass(frozen=True)
class JobRounds(TraceReplay):
    """A closed-loop job: `concurrency` requests in flight, the next sent when one ends,
    every round the same `groups` (name, count, prompt tokens, output tokens) in order;
    each request asks for exactly its output (max_tokens = output)."""

    specs: Sequence[RequestSpec] = field(init=False, repr=False, compare=False)
    path: str = field(init=False, default="", repr=False, compare=False)
    concurrency: int | None = 64
    groups: tuple[tuple[str, int, int, int], ...] = ()

    def __post_init__(self) -> None:
        check_int("rounds.concurrency", self.concurrency, lo=1, hi=MAX_CONCURRENCY)
        if not self.groups:
            raise WorkloadError("rounds.groups = []: a round needs at least one group")
        seen: set[str] = set()
        for i, group in enumerate(self.groups):
            if len(group) != 4:
                raise WorkloadError(f"rounds.groups[{i}] = {preview(group)}: must be "
                                    "(name, count, prompt, output)")
            name, count, prompt, output = group
            where = f"rounds.groups[{i}]"
            if check_str(f"{where}.name", name) in seen:
                raise WorkloadError(f"{where}.name = {name!r}: names must be unique")
            seen.add(name)
            check_int(f"{where}.count", count, lo=1, hi=MAX_NUM_REQUESTS)
            check_int(f"{where}.prompt", prompt, lo=1, hi=MAX_LEN)
            check_int(f"{where}.output", output, lo=1, hi=MAX_LEN)
        object.__setattr__(self, "groups", tuple(tuple(g) for g in self.groups))
        object.__setattr__(self, "specs", _RoundSpecs(self.groups))

    @property
    def round_size(self) -> int:
        return sum(count for _, count, _, _ in self.groups)

    def describe(self) -> str:
        mix = " + ".join(f"{count} {name} ({prompt} -> {output} tokens)"
                         for name, count, prompt, output in self.groups)
        return f"job rounds of {mix}, closed loop, {self.concurrency} in flight"

    def to_dict(self) -> Any:
        return {"rounds": {"concurrency": self.concurrency, "groups": [
            dict(zip(GROUP_KEYS, group)) for group in self.groups]}}

    @classmethod
    def from_yaml(cls, body: Any) -> JobRounds:
        body = _mapping("rounds", body, ("concurrency", "groups"))
        groups = body["groups"]
        if not isinstance(groups, list):
            raise WorkloadError(f"rounds.groups = {preview(groups)}: must be a list of "
                                f"{{{', '.join(GROUP_KEYS)}}}")
        rows = []
        for i, group in enumerate(groups):
            group = _mapping(f"rounds.groups[{i}]", group, GROUP_KEYS)
            rows.append(tuple(group[k] for k in GROUP_KEYS))
        return cls(concurrency=body["concurrency"], groups=tuple(rows))


@dataclass(frozen=True)
class RateSchedule(ArrivalProcess):
    """Poisson arrivals at a rate that changes over time: linear between `points`
    (seconds, req/s), the first at 0 s, constant after the last (which must be > 0)."""

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        points = self.points
        if not isinstance(points, (list, tuple)) or not 1 <= len(points) <= MAX_POINTS:
            raise WorkloadError(f"rate_schedule.points = {preview(points)}: must be 1 to "
                                f"{MAX_POINTS} [seconds, req/s] pairs")
        clean: list[tuple[float, float]] = []
        for i, point in enumerate(points):
            if not isinstance(point, (list, tuple)) or len(point) != 2:
                raise WorkloadError(f"rate_schedule.points[{i}] = {preview(point)}: must be "
                                    "[seconds, req/s]")
            t = check_range(f"rate_schedule.points[{i}] seconds", point[0], 0.0, MAX_SECONDS)
            rate = check_range(f"rate_schedule.points[{i}] rate", point[1], 0.0, MAX_RATE)
            if clean and t <= clean[-1][0]:
                raise WorkloadError(f"rate_schedule.points[{i}] seconds = {t:g}: must be "
                                    f"after the point before ({clean[-1][0]:g})")
            clean.append((float(t), float(rate)))
        if clean[0][0] != 0.0:
            raise WorkloadError(f"rate_schedule.points[0] seconds = {clean[0][0]:g}: the "
                                "schedule starts at 0")
        if clean[-1][1] <= 0.0:
            raise WorkloadError(f"rate_schedule.points[{len(clean) - 1}] rate = 0: the last "
                                "rate holds forever and must be > 0")
        object.__setattr__(self, "points", tuple(clean))

    def rate_at(self, t: float) -> float:
        """The rate at `t` seconds: linear between points, the last one after them."""
        times = [p[0] for p in self.points]
        k = bisect.bisect_right(times, t) - 1
        if k + 1 >= len(self.points):
            return self.points[-1][1]
        (t0, r0), (t1, r1) = self.points[k], self.points[k + 1]
        return r0 + (r1 - r0) * (t - t0) / (t1 - t0)

    def times(self, n: int, rng: random.Random) -> list[float]:
        # Thinning: candidates at the highest rate, each kept with probability rate(t) /
        # highest; the first request goes out at 0, as every open loop's does.
        top = max(rate for _, rate in self.points)
        out, t = [0.0] if n else [], 0.0
        while len(out) < n:
            t += rng.expovariate(top)
            if rng.random() * top < self.rate_at(t):
                out.append(t)
        return out

    def describe(self) -> str:
        steps = ", ".join(f"{rate:g} req/s at {t:g} s" for t, rate in self.points)
        return f"poisson on a rate schedule: {steps}, then steady"

    def to_dict(self) -> Any:
        return {"rate_schedule": {"points": [list(p) for p in self.points]}}

    @classmethod
    def from_yaml(cls, body: Any) -> RateSchedule:
        points = _mapping("rate_schedule", body, ("points",))["points"]
        if isinstance(points, list):  # YAML lists: the constructor checks each pair
            points = tuple(tuple(p) if isinstance(p, list) else p for p in points)
        return cls(points)


def _mapping(where: str, body: Any, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise WorkloadError(f"{where} = {preview(body)}: must be a mapping with keys "
                            f"{', '.join(keys)}")
    check_keys(where, body, keys, keys)
    return body


# The YAML kinds these shapes add to workload/loader.py's arrivals, and their readers.
SHAPES: dict[str, Callable[[Any], ArrivalProcess]] = {
    "rounds": JobRounds.from_yaml,
    "rate_schedule": RateSchedule.from_yaml,
}
