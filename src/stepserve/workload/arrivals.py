"""When requests arrive, and the YAML shapes that name each process (`parse_arrival`):

    {poisson: {rate: 5.0}}                       # independent users
    {gamma: {rate: 5.0, burstiness: 0.5}}        # burstier (< 1) or smoother (> 1)
    {constant: {rate: 2.0}}
    {closed_loop: {concurrency: 64}}             # `batch:` is another name for it
    {trace: requests.jsonl}  or  {trace: {path: requests.jsonl, concurrency: 64}}
    {rounds: {concurrency: 64, groups: [{name: short, count: 54, prompt: 128, output: 20},
                                        {name: long, count: 10, prompt: 128, output: 2000}]}}
    {rate_schedule: {points: [[0, 13.0], [120, 13.0], [180, 16.33]]}}   # [seconds, req/s]

Open loop: the first request at 0.0 (sent at once, as `vllm bench serve` does). Closed
loop: every request is available from the start (times all 0.0) and the runner keeps
`closed_loop_concurrency` in flight.
"""

from __future__ import annotations

import abc
import bisect
import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from stepserve.config.limits import (
    MAX_BURSTINESS,
    MAX_CONCURRENCY,
    MAX_LEN,
    MAX_NUM_REQUESTS,
    MAX_RATE,
    MAX_SECONDS,
    MIN_BURSTINESS,
    MIN_RATE,
)
from stepserve.config.user_files import preview
from stepserve.workload.errors import (
    WorkloadError,
    check_int,
    check_keys,
    check_range,
    check_str,
    keyed,
    located,
    one_key,
    resolved,
)
from stepserve.workload.trace import RequestSpec, load_trace

GROUP_KEYS = ("name", "count", "prompt", "output")
MAX_POINTS = 1_000


class ArrivalProcess(abc.ABC):
    # a kind whose YAML body is a mapping of exactly `keys`, its fields in that order
    kind: ClassVar[str] = ""
    keys: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def times(self, n: int, rng: random.Random) -> list[float]:
        """n non-decreasing arrival times in seconds, the first at 0.0."""

    @property
    def closed_loop_concurrency(self) -> int | None:
        """Requests kept in flight (closed loop), or None for open-loop arrivals: a process
        with a `concurrency` (closed_loop, a trace replayed closed-loop, rounds) has one."""
        return getattr(self, "concurrency", None)

    @abc.abstractmethod
    def describe(self) -> str: ...

    def to_dict(self) -> Any:
        return {self.kind: {key: getattr(self, f.name)
                            for key, f in zip(self.keys, dataclasses.fields(self))}}


def _from_gaps(n: int, gap: Any) -> list[float]:
    """Arrival i is the sum of the first i gaps: request 0 goes out at t = 0."""
    times, now = [], 0.0
    for i in range(n):
        if i:
            now += gap()
        times.append(now)
    return times


@dataclass(frozen=True)
class RatedArrival(ArrivalProcess):
    """Open-loop arrivals at a mean rate: the processes a rate override applies to."""

    rate_per_s: float
    keys = ("rate",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate_per_s", check_range(f"{self.kind}.rate", self.rate_per_s,
                                                           MIN_RATE, MAX_RATE))

    def describe(self) -> str:
        return f"{self.kind} {self.rate_per_s:g} req/s"


@dataclass(frozen=True)
class Poisson(RatedArrival):
    """Exponential gaps with mean 1/rate: independent users."""

    kind = "poisson"

    def times(self, n: int, rng: random.Random) -> list[float]:
        return _from_gaps(n, lambda: rng.expovariate(self.rate_per_s))


@dataclass(frozen=True)
class Gamma(RatedArrival):
    """Gamma gaps with mean 1/rate and shape = burstiness, as in `vllm bench serve`:
    burstiness 1 is Poisson, below 1 burstier (CV^2 of the gaps = 1/burstiness), above 1
    smoother."""

    burstiness: float = 1.0
    kind, keys = "gamma", ("rate", "burstiness")

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "burstiness", check_range(
            "gamma.burstiness", self.burstiness, MIN_BURSTINESS, MAX_BURSTINESS))

    def times(self, n: int, rng: random.Random) -> list[float]:
        # mean gap = shape * scale = 1/rate, whatever the shape
        scale = 1.0 / (self.rate_per_s * self.burstiness)
        return _from_gaps(n, lambda: rng.gammavariate(self.burstiness, scale))

    def describe(self) -> str:
        return f"{super().describe()}, burstiness {self.burstiness:g}"


@dataclass(frozen=True)
class Constant(RatedArrival):
    """Evenly spaced: one request every 1/rate seconds (no randomness)."""

    kind = "constant"

    def times(self, n: int, rng: random.Random) -> list[float]:
        return [i / self.rate_per_s for i in range(n)]


@dataclass(frozen=True)
class ClosedLoop(ArrivalProcess):
    """N clients, each sending its next request when the previous one finishes (a batch
    job, or the promo-spike incident's "140 concurrent users")."""

    concurrency: int
    kind, keys = "closed_loop", ("concurrency",)

    def __post_init__(self) -> None:
        check_int("closed_loop.concurrency", self.concurrency, lo=1, hi=MAX_CONCURRENCY)

    def times(self, n: int, rng: random.Random) -> list[float]:
        return [0.0] * n

    def describe(self) -> str:
        return f"closed loop, {self.concurrency} in flight"


@dataclass(frozen=True)
class TraceReplay(ArrivalProcess):
    """Replay recorded requests: arrival times *and* lengths come from the trace, so a
    workload with this arrival has no classes. With `concurrency` the trace's lengths are
    replayed closed-loop instead and its times are ignored."""

    specs: tuple[RequestSpec, ...] = field(repr=False)
    path: str = ""
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if not self.specs:
            raise WorkloadError(f"trace = {self.path!r}: holds no requests")
        # sorted (stably) so replay order is arrival order, whatever the file's order
        object.__setattr__(self, "specs", tuple(sorted(self.specs, key=lambda s: s.arrival_s)))
        if self.concurrency is not None:
            check_int("trace.concurrency", self.concurrency, lo=1, hi=MAX_CONCURRENCY)

    def times(self, n: int, rng: random.Random) -> list[float]:
        if self.concurrency is not None:
            return [0.0] * n
        return [s.arrival_s for s in self.specs[:n]]

    def describe(self) -> str:
        how = f", closed loop {self.concurrency} in flight" if self.concurrency else ""
        return f"trace {self.path or '(in memory)'} ({len(self.specs)} requests{how})"

    def to_dict(self) -> Any:
        if self.concurrency is None:
            return {"trace": self.path}
        return {"trace": {"path": self.path, "concurrency": self.concurrency}}


class _RoundSpecs(Sequence[RequestSpec]):
    """Request i of a job that repeats `groups` (name, count, prompt, output) forever, in
    order; as long as a workload may be, built only when read (by index: a job is always
    replayed closed-loop, so never sliced by arrival)."""

    def __init__(self, groups: tuple[tuple[str, int, int, int], ...]) -> None:
        self.order = [(name, prompt, output) for name, count, prompt, output in groups
                      for _ in range(count)]

    def __len__(self) -> int:
        return MAX_NUM_REQUESTS

    def __getitem__(self, i: int) -> RequestSpec:  # type: ignore[override]
        if not 0 <= i < len(self):
            raise IndexError(i)
        name, prompt, output = self.order[i % len(self.order)]
        return RequestSpec(i, 0.0, prompt, output, output, request_class=name)


@dataclass(frozen=True)
class JobRounds(TraceReplay):
    """A batch job that sends the same requests every round, in the same order (the
    night-report job: 54 short and 10 long reports a round, 64 in flight): `concurrency`
    in flight, every round the same `groups` (name, count, prompt tokens, output tokens).
    Its lengths are exact, not sampled (max_tokens = output), so it is a trace generated
    on demand: any count, no file."""

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

    def describe(self) -> str:
        mix = " + ".join(f"{count} {name} ({prompt} -> {output} tokens)"
                         for name, count, prompt, output in self.groups)
        return f"job rounds of {mix}, closed loop, {self.concurrency} in flight"

    def to_dict(self) -> Any:
        return {"rounds": {"concurrency": self.concurrency, "groups": [
            dict(zip(GROUP_KEYS, group)) for group in self.groups]}}


@dataclass(frozen=True)
class RateSchedule(ArrivalProcess):
    """Poisson arrivals at a rate that changes over time (the promotion that lifts a daily
    rate to its peak at 20:00): linear between `points` (seconds, req/s), the first at
    0 s, constant after the last (which must be > 0)."""

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


KEYED_KINDS: dict[str, type[ArrivalProcess]] = {
    **{cls.kind: cls for cls in (Poisson, Gamma, Constant, ClosedLoop)}, "batch": ClosedLoop}
ARRIVAL_KINDS = (*KEYED_KINDS, "trace", "rounds", "rate_schedule")


def parse_arrival(data: Any, where: str = "arrival",
                  base_dir: Path | None = None) -> ArrivalProcess:
    """Build an arrival process from its YAML shape; `where` prefixes error messages and
    `base_dir` resolves a relative trace path."""
    with located(where):
        kind, body = one_key("", data, ARRIVAL_KINDS)
        if kind in KEYED_KINDS:
            cls = KEYED_KINDS[kind]
            body = keyed(kind, body, cls.keys)
            return cls(*(body[k] for k in cls.keys))
        if kind == "rounds":
            body = keyed("rounds", body, ("concurrency", "groups"))
            groups = body["groups"]
            if not isinstance(groups, list):
                raise WorkloadError(f"rounds.groups = {preview(groups)}: must be a list of "
                                    f"{{{', '.join(GROUP_KEYS)}}}")
            rows = []
            for i, group in enumerate(groups):
                group = keyed(f"rounds.groups[{i}]", group, GROUP_KEYS)
                rows.append(tuple(group[k] for k in GROUP_KEYS))
            return JobRounds(concurrency=body["concurrency"], groups=tuple(rows))
        if kind == "rate_schedule":
            points = keyed("rate_schedule", body, ("points",))["points"]
            if isinstance(points, list):  # YAML lists: the constructor checks each pair
                points = tuple(tuple(p) if isinstance(p, list) else p for p in points)
            return RateSchedule(points)
        concurrency = None
        if isinstance(body, Mapping):
            check_keys("trace", body, ("path", "concurrency"), ("path",))
            concurrency = body.get("concurrency")
            body = body["path"]
        path = resolved(check_str("trace", body), base_dir)
        if concurrency is not None:  # before the file is read
            check_int("trace.concurrency", concurrency, lo=1, hi=MAX_CONCURRENCY)
        return TraceReplay(tuple(load_trace(path)), str(path), concurrency)
