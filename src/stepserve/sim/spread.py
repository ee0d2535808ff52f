"""A target's measured spread in the simulator: tails, not only means.

A target profile (profile/target_fit.py) keeps two spreads as data, each a bounded sorted
sample of ratios to their median: the decode gaps (the step's own jitter, with the HTTP
path's on top, as a client sees it) and the HTTP floor (one-token TTFTs). Here:

* `SpreadCost` wraps a cost model: each step's time is the model's times a factor drawn
  from the step-gap sample (the fit is to medians, so a factor of 1.0 is the typical
  step). Draws come from a seeded generator per replica (`for_replica`), so a run is
  reproducible and a scenario's runs do not share one stream.
* `HttpFloor` draws each request's HTTP path time, added to the client-side latencies
  where the simulator reports them (`bench --sim`): the floor's median less the lone
  decode step in it (`http_overhead_s`), plus the floor's own jitter around its median.

A profile without a spread keeps the cost model as it was (no wrapper): the
deterministic path is untouched.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stepserve.config.validate import Allowed
from stepserve.core.output import SchedulerOutput
from stepserve.sim.cost import CostModel

# What a profile's spread may say. A factor is a time over its median: a step a
# hundred times its median is past any real engine's jitter (a stall that long is an
# outage, not a spread), and a zero or negative one is no time at all.
MAX_FACTOR = 100.0
FACTOR = Allowed(0.0, MAX_FACTOR, kind=float, lo_open=True)
SECONDS = Allowed(0.0, 60.0, kind=float)
MAX_SAMPLES = 100_000


@dataclass(frozen=True)
class Sample:
    """Ratios to a median (1.0: typical), sorted, and the median they are of."""

    factors: tuple[float, ...]
    median_s: float

    @classmethod
    def from_json(cls, where: str, data: Any) -> Sample:
        """A spread's distribution (target_fit.Distribution as JSON); ValueError naming
        the field and the value for anything that is not a bounded positive ratio."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: must be a mapping with samples and median_s")
        raw = data.get("samples", [])
        if not isinstance(raw, list) or len(raw) > MAX_SAMPLES:
            raise ValueError(f"{where}.samples: must be a list of at most {MAX_SAMPLES:,} "
                             "ratios")
        factors = tuple(FACTOR.check(f"{where}.samples[{i}]", v, ValueError)
                        for i, v in enumerate(raw))
        median = SECONDS.check(f"{where}.median_s", data.get("median_s", 0.0), ValueError)
        return cls(tuple(sorted(factors)), median)


@dataclass(frozen=True)
class HttpFloor:
    """One request's HTTP path time: `overhead_s` (the path's median) plus the floor's
    jitter, `median_s` x (factor - 1), never below zero."""

    overhead_s: float
    sample: Sample

    def draws(self, n: int, seed: int) -> list[float]:
        """`n` path times, reproducible for a seed."""
        rng = random.Random(seed)
        f, m, o = self.sample.factors, self.sample.median_s, self.overhead_s
        if not f:
            return [o] * n
        return [max(0.0, o + m * (f[int(rng.random() * len(f))] - 1.0)) for _ in range(n)]


@dataclass(frozen=True)
class Spread:
    """A profile's spread as the simulator uses it (None parts: not measured)."""

    step: Sample | None
    http: HttpFloor | None

    @classmethod
    def from_json(cls, data: Any) -> Spread | None:
        """A target profile's `spread`; None when it measured none."""
        if data is None:
            return None
        if not isinstance(data, dict):
            raise ValueError("target profile: `spread` must be a mapping")
        step = http = None
        if data.get("step_gap") is not None:
            step = Sample.from_json("spread.step_gap", data["step_gap"])
        if data.get("http_floor") is not None:
            floor = Sample.from_json("spread.http_floor", data["http_floor"])
            overhead = SECONDS.check("spread.http_overhead_s",
                                     data.get("http_overhead_s", 0.0), ValueError)
            http = HttpFloor(overhead, floor)
        return cls(step if step and step.factors else None, http)


class SpreadCost(CostModel):
    """`inner`'s step times, each times a factor drawn from `factors`."""

    def __init__(self, inner: CostModel, factors: Sequence[float], seed: int = 0,
                 replica: int = 0) -> None:
        if not factors:
            raise ValueError("a spread needs at least one factor")
        self.inner, self.factors, self.seed = inner, tuple(factors), seed
        self.name = inner.name
        self._rng = random.Random(f"{seed}/{replica}")
        self._inner_decode = inner.decode_step_time

    def for_replica(self, index: int) -> SpreadCost:
        """A fresh stream for one replica of one simulation: the same seed draws the
        same factors whatever ran before."""
        return SpreadCost(self.inner, self.factors, self.seed, index)

    def _factor(self) -> float:
        f = self.factors
        return f[int(self._rng.random() * len(f))]

    def step_time(self, out: SchedulerOutput) -> float:
        return self.inner.step_time(out) * self._factor()

    def decode_step_time(self, batch: int, computed: int) -> float | None:
        t = self._inner_decode(batch, computed)
        return None if t is None else t * self._factor()

    def describe(self) -> str:
        f = self.factors
        p99 = f[min(len(f) - 1, int(0.99 * len(f)))]
        return (f"{self.inner.describe()}; each step times a factor drawn from the "
                f"measured spread ({len(f)} samples, p99 {p99:.2f}x, seed {self.seed})")
