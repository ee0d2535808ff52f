"""When requests arrive: open-loop processes (Poisson, gamma, constant rate, trace replay)
and the closed loop (N requests kept in flight).

Open loop: `times(n, rng)` gives n non-decreasing arrival times starting at 0.0 (the first
request is sent at once, as `vllm bench serve` does). Closed loop: every request is
available from the start and the runner keeps `closed_loop_concurrency` of them in flight,
issuing the next when one finishes; arrival times are all 0.0 and mean nothing.

Their YAML shapes are read by `parse.parse_arrival`. Rates, burstiness and concurrency are
bounded by limits.py.
"""

from __future__ import annotations

import abc
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepserve.config.limits import (
    MAX_BURSTINESS,
    MAX_CONCURRENCY,
    MAX_RATE,
    MIN_BURSTINESS,
    MIN_RATE,
)
from stepserve.workload.errors import WorkloadError, check_int, check_range

if TYPE_CHECKING:
    from stepserve.workload.spec import RequestSpec


class ArrivalProcess(abc.ABC):
    """Arrival times for a workload."""

    @abc.abstractmethod
    def times(self, n: int, rng: random.Random) -> list[float]:
        """n non-decreasing arrival times in seconds, the first at 0.0."""

    @property
    def closed_loop_concurrency(self) -> int | None:
        """Requests kept in flight (closed loop), or None for open-loop arrivals."""
        return None

    @abc.abstractmethod
    def describe(self) -> str: ...

    @abc.abstractmethod
    def to_dict(self) -> Any: ...


def _from_gaps(n: int, gap: Any) -> list[float]:
    """Arrival i is the sum of the first i gaps: request 0 goes out at t = 0."""
    times, now = [], 0.0
    for i in range(n):
        if i:
            now += gap()
        times.append(now)
    return times


@dataclass(frozen=True)
class Poisson(ArrivalProcess):
    """Exponential gaps with mean 1/rate: independent users."""

    rate_per_s: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate_per_s",
                           check_range("poisson.rate", self.rate_per_s, MIN_RATE, MAX_RATE))

    def times(self, n: int, rng: random.Random) -> list[float]:
        return _from_gaps(n, lambda: rng.expovariate(self.rate_per_s))

    def describe(self) -> str:
        return f"poisson {self.rate_per_s:g} req/s"

    def to_dict(self) -> Any:
        return {"poisson": {"rate": self.rate_per_s}}


@dataclass(frozen=True)
class Gamma(ArrivalProcess):
    """Gamma gaps with mean 1/rate and shape = burstiness, as in `vllm bench serve`:
    burstiness 1 is Poisson, below 1 burstier (CV^2 of the gaps = 1/burstiness), above 1
    smoother."""

    rate_per_s: float
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate_per_s",
                           check_range("gamma.rate", self.rate_per_s, MIN_RATE, MAX_RATE))
        object.__setattr__(self, "burstiness", check_range(
            "gamma.burstiness", self.burstiness, MIN_BURSTINESS, MAX_BURSTINESS))

    def times(self, n: int, rng: random.Random) -> list[float]:
        # mean gap = shape * scale = 1/rate, whatever the shape
        scale = 1.0 / (self.rate_per_s * self.burstiness)
        return _from_gaps(n, lambda: rng.gammavariate(self.burstiness, scale))

    def describe(self) -> str:
        return f"gamma {self.rate_per_s:g} req/s, burstiness {self.burstiness:g}"

    def to_dict(self) -> Any:
        return {"gamma": {"rate": self.rate_per_s, "burstiness": self.burstiness}}


@dataclass(frozen=True)
class Constant(ArrivalProcess):
    """Evenly spaced: one request every 1/rate seconds (no randomness)."""

    rate_per_s: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate_per_s",
                           check_range("constant.rate", self.rate_per_s, MIN_RATE, MAX_RATE))

    def times(self, n: int, rng: random.Random) -> list[float]:
        return [i / self.rate_per_s for i in range(n)]

    def describe(self) -> str:
        return f"constant {self.rate_per_s:g} req/s"

    def to_dict(self) -> Any:
        return {"constant": {"rate": self.rate_per_s}}


@dataclass(frozen=True)
class ClosedLoop(ArrivalProcess):
    """N clients, each sending its next request when the previous one finishes (a batch
    job, or the promo-spike incident's "140 concurrent users")."""

    concurrency: int

    def __post_init__(self) -> None:
        check_int("closed_loop.concurrency", self.concurrency, lo=1, hi=MAX_CONCURRENCY)

    def times(self, n: int, rng: random.Random) -> list[float]:
        return [0.0] * n

    @property
    def closed_loop_concurrency(self) -> int | None:
        return self.concurrency

    def describe(self) -> str:
        return f"closed loop, {self.concurrency} in flight"

    def to_dict(self) -> Any:
        return {"closed_loop": {"concurrency": self.concurrency}}


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

    @property
    def closed_loop_concurrency(self) -> int | None:
        return self.concurrency

    def describe(self) -> str:
        how = f", closed loop {self.concurrency} in flight" if self.concurrency else ""
        return f"trace {self.path or '(in memory)'} ({len(self.specs)} requests{how})"

    def to_dict(self) -> Any:
        if self.concurrency is None:
            return {"trace": self.path}
        return {"trace": {"path": self.path, "concurrency": self.concurrency}}


# ---- lower-case constructors ----

def poisson(rate_per_s: float) -> Poisson:
    return Poisson(rate_per_s)


def gamma(rate_per_s: float, burstiness: float = 1.0) -> Gamma:
    return Gamma(rate_per_s, burstiness)


def constant(rate_per_s: float) -> Constant:
    return Constant(rate_per_s)


def closed_loop(concurrency: int) -> ClosedLoop:
    return ClosedLoop(concurrency)


def trace_replay(path: str | Path, concurrency: int | None = None) -> TraceReplay:
    from stepserve.workload.trace import load_trace

    return TraceReplay(tuple(load_trace(path)), str(path), concurrency)
